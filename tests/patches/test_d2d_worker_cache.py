"""The worker side of the D2D tensor cache (vendor items C1/C2 with A2's payloads) on a one-rank fake
worker whose methods carry our wrappers: generate caches and hands the driver only prompts/responses/
attention_mask, ref takes its inputs from the cache and keeps ref_log_prob there, update unions the cache
with the driver's advantages and clears it, also when it fails; validation and calls without the driver's
flag pass through; a worker call with meta_info global_steps=7 makes the installed watchdog report step 7.
The reshard across ranks is tested over gloo in test_d2d_worker_multiproc.py."""

from __future__ import annotations

import logging

import pytest
import torch

from d2d_fake_worker import FakeWorker, ref_log_prob_of, rollout_chunk, worker_config
from verl_patches.patches.verl.workers.d2d_cache import CACHE_ATTR, D2DFlowError, cache_of
from verl_patches.reshard.errors import TensorCachePreconditionError
from verl_patches.worker_calls.meta_keys import D2D_META_KEY, DP_RANKS_META_KEY, STEP_META_KEY
from verl_patches.worker_calls.step_payloads import (
    GENERATE_TO_DRIVER_WITH_D2D,
    ref_payload,
    stamp,
    update_payload,
)

DataProto = pytest.importorskip("verl.protocol", reason="vendored verl needed").DataProto

ROWS = 4
DP_MAP = {DP_RANKS_META_KEY: [0]}


def prompts(d2d: bool = True, step: int = 1, **meta) -> DataProto:
    data = DataProto.from_dict({"input_ids": torch.zeros(ROWS, 3, dtype=torch.long)}, meta_info=dict(meta))
    return stamp(data, step, d2d)


def driver_batch(gen_out: DataProto) -> DataProto:
    """What the driver holds after generate, plus the advantages it computes."""
    batch = DataProto.from_dict({k: v for k, v in gen_out.batch.items()})
    batch.batch["advantages"] = torch.arange(ROWS * 2, dtype=torch.float32).view(ROWS, 2)
    batch.meta_info["global_token_num"] = [5] * ROWS
    return batch


def run_step(w: FakeWorker, step: int = 1) -> tuple[DataProto, DataProto, DataProto]:
    gen_out = w.generate_sequences(prompts(step=step))
    batch = driver_batch(gen_out)
    ref_in = stamp(ref_payload(batch, True), step, True)
    ref_in.meta_info.update(DP_MAP)
    ref_out = w.compute_ref_log_prob(ref_in)
    upd_in = stamp(update_payload(batch, True), step, True)
    upd_in.meta_info.update(DP_MAP)
    upd_out = w.update_actor(upd_in)
    return gen_out, ref_out, upd_out


def test_generate_caches_and_hands_the_driver_only_what_it_needs() -> None:
    w = FakeWorker(0, 1, ROWS)
    out = w.generate_sequences(prompts())
    assert sorted(out.batch.keys()) == sorted(GENERATE_TO_DRIVER_WITH_D2D)
    chunk = rollout_chunk(0, ROWS)
    cache = cache_of(w)
    assert sorted(cache.keys()) == ["attention_mask", "input_ids", "position_ids", "responses", "rollout_log_probs"]
    for k in cache.keys():
        assert torch.equal(cache.peek(k)[0], chunk[k]) and cache.layout_of(k) == "rollout"
    for k in GENERATE_TO_DRIVER_WITH_D2D:
        assert torch.equal(out.batch[k], chunk[k])


@pytest.mark.parametrize("meta", [{"validate": True}, {}])
def test_validation_and_unflagged_calls_are_not_cached(meta: dict) -> None:
    w = FakeWorker(0, 1, ROWS)
    data = prompts(d2d=bool(meta), **meta)
    out = w.generate_sequences(data)
    assert sorted(out.batch.keys()) == sorted(rollout_chunk(0, ROWS))
    assert cache_of(w) is None


def test_one_step_ref_reads_the_cache_update_unions_and_clears() -> None:
    w = FakeWorker(0, 1, ROWS)
    _, ref_out, upd_out = run_step(w)
    chunk = rollout_chunk(0, ROWS)
    assert sorted(w.seen["ref"]) == ["attention_mask", "input_ids", "position_ids", "responses"]
    for k, v in w.seen["ref"].items():
        assert torch.equal(v, chunk[k]), k
    assert list(ref_out.batch.keys()) == [] and len(ref_out) == ROWS  # nothing but its size to the driver
    seen = w.seen["update"]
    assert sorted(seen) == [
        "advantages",
        "attention_mask",
        "input_ids",
        "position_ids",
        "ref_log_prob",
        "responses",
        "rollout_log_probs",
    ]
    assert torch.equal(seen["ref_log_prob"], ref_log_prob_of(chunk["input_ids"]))
    assert torch.equal(seen["rollout_log_probs"], chunk["rollout_log_probs"])  # for the actor's mismatch metric
    assert torch.equal(seen["advantages"], torch.arange(ROWS * 2, dtype=torch.float32).view(ROWS, 2))
    assert w.seen["update_meta"]["global_token_num"] == [5] * ROWS  # the driver's meta_info arrives
    assert upd_out.meta_info["metrics"] == {"actor/pg_loss": [0.0]}
    assert len(cache_of(w)) == 0
    run_step(w, step=2)  # the next step re-puts freely
    assert len(cache_of(w)) == 0


@pytest.mark.parametrize("where", ["ref", "update"])
def test_a_failed_call_leaves_no_stale_entries(where: str) -> None:
    w = FakeWorker(0, 1, ROWS)
    w.fail.add(where)
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        run_step(w)
    assert len(cache_of(w)) == 0
    w.fail.clear()
    run_step(w, step=2)
    assert len(cache_of(w)) == 0


def test_generate_drops_entries_of_an_unfinished_step(caplog: pytest.LogCaptureFixture) -> None:
    w = FakeWorker(0, 1, ROWS)
    w.generate_sequences(prompts(step=1))  # the driver died before ref/update
    with caplog.at_level(logging.WARNING, logger="verl_patches"):
        run_step(w, step=2)
    assert "unfinished step" in caplog.text
    assert torch.equal(w.seen["update"]["responses"], rollout_chunk(0, ROWS)["responses"])


def test_out_of_order_or_incomplete_calls_are_named_errors() -> None:
    w = FakeWorker(0, 1, ROWS)
    batch = driver_batch(
        DataProto.from_dict({k: v for k, v in rollout_chunk(0, ROWS).items() if k in GENERATE_TO_DRIVER_WITH_D2D})
    )
    ref_in = stamp(ref_payload(batch, True), 1, True)
    ref_in.meta_info.update(DP_MAP)
    with pytest.raises(D2DFlowError, match="rank 0: compute_ref_log_prob .* cached nothing"):
        w.compute_ref_log_prob(ref_in)
    w.generate_sequences(prompts())
    del ref_in.meta_info[DP_RANKS_META_KEY]
    with pytest.raises(D2DFlowError, match=DP_RANKS_META_KEY):
        w.compute_ref_log_prob(ref_in)
    assert len(cache_of(w)) == 0  # cleared by the failure
    w.generate_sequences(prompts())
    short = stamp(ref_payload(batch[:2], True), 1, True)  # the driver reordered/padded: row counts differ
    short.meta_info.update(DP_MAP)
    with pytest.raises(D2DFlowError, match="got 2 rows from the driver.*4 per Megatron DP rank"):
        w.compute_ref_log_prob(short)


@pytest.mark.parametrize(
    "override, key",
    [
        ({"use_kl_loss": False}, "actor_rollout_ref.actor.use_kl_loss"),
        ({"recompute_old_log_prob": True}, "actor_rollout_ref.actor.recompute_old_log_prob"),
        ({"ppo_epochs": 2}, "actor_rollout_ref.actor.ppo_epochs"),
    ],
)
def test_worker_preconditions_name_the_key(override: dict, key: str) -> None:
    w = FakeWorker(0, 1, ROWS, config=worker_config(**override))
    with pytest.raises(TensorCachePreconditionError) as e:
        w.generate_sequences(prompts())
    assert list(e.value.violations) == [key]
    assert not hasattr(w, CACHE_ATTR)


def test_the_role_must_be_fused() -> None:
    w = FakeWorker(0, 1, ROWS)
    w._is_ref = False
    with pytest.raises(TensorCachePreconditionError, match="overlay.fused_actor_rollout_ref"):
        w.generate_sequences(prompts())


def test_a_worker_call_records_its_step_in_the_progress() -> None:
    """The step the driver stamps is the position's step (hang reports name it); a call without one keeps
    the last step; between calls the rank is idle."""
    from verl_patches.resilience import progress

    progress.reset()
    w = FakeWorker(0, 1, ROWS)
    w.generate_sequences(prompts(d2d=False, step=7))
    pos = progress.current()[0]
    assert pos.step == 7 and pos.phase == "idle" and pos.call == "generate_sequences"
    data = prompts(d2d=False, step=8)
    del data.meta_info[STEP_META_KEY]  # a call without a step keeps the last one
    w.generate_sequences(data)
    assert progress.current()[0].step == 7
    w.update_actor(DataProto.from_dict({"advantages": torch.zeros(ROWS, 2)}, meta_info={STEP_META_KEY: 9}))
    assert progress.current()[0].step == 9
    progress.reset()


def test_stamp_writes_step_and_flag() -> None:
    data = stamp(DataProto.from_dict({"x": torch.zeros(2)}), 3, True)
    assert data.meta_info == {STEP_META_KEY: 3, D2D_META_KEY: True}


def test_ref_payload_and_answer_cross_ray_pickling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both are batches with a size and no tensor; upstream's __getstate__ cannot consolidate those."""
    import pickle

    from verl_patches.patches.verl.protocol import pickle_empty_batch

    monkeypatch.setattr(DataProto, "__getstate__", pickle_empty_batch(DataProto.__getstate__))
    w = FakeWorker(0, 1, ROWS)
    gen_out = w.generate_sequences(prompts())
    batch = driver_batch(pickle.loads(pickle.dumps(gen_out)))
    ref_in = pickle.loads(pickle.dumps(stamp(ref_payload(batch, True), 1, True).chunk(1)[0]))
    assert len(ref_in) == ROWS and list(ref_in.batch.keys()) == [] and ref_in.meta_info[D2D_META_KEY]
    ref_in.meta_info.update(DP_MAP)
    ref_out = pickle.loads(pickle.dumps(w.compute_ref_log_prob(ref_in)))
    assert len(batch.union(DataProto.concat([ref_out]))) == ROWS
    full = pickle.loads(pickle.dumps(batch))  # a batch with tensors still takes upstream's path
    assert torch.equal(full.batch["advantages"], batch.batch["advantages"])
