"""Step metrics named like the vendor's step table (issue 5, item 7): the pure function reproduces the
vendor's published per-card throughput from its own step table (reference §2), the wrapper around verl's
compute_throughout_metrics keeps verl's keys, and the step-timing wrappers keep verl's @register dispatch
attributes while handing the measured weight-switch time to the driver."""

from __future__ import annotations

import time

import pytest
import torch

from verl_patches.patches.verl.trainer.metrics import reference_step_metrics, with_reference_metrics
from verl_patches.patches.verl.workers.step_timing import ATTR, report_switch_time, timed_enter
from verl_patches.worker_calls.env_names import DIES_PER_CARD_ENV
from verl_patches.worker_calls.meta_keys import TIMING_META_KEY

# Reference §2: 128 A3 cards = 256 dies, GBS 512 x n 16 = 8192 sequences per step.
SEQS, DIES, DIES_PER_CARD = 8192, 256, 2
TRUE_WEIGHT = dict(
    step=859.68,
    rollout=373.65,
    update=319.3,
    switch=17.0,
    avg_in=77.8,
    avg_out=1576.6,
    system=123.16,
    inference=271.05,
    training=331.6,
)
RANDOM_INIT = dict(
    step=796.8, rollout=318.27, update=328.8, switch=35.63, avg_in=75.0, avg_out=3039.8, system=250.2, training=607.2
)


def vendor_step(row: dict, with_switch: bool) -> dict[str, float]:
    total = SEQS * (row["avg_in"] + row["avg_out"])
    response = SEQS * row["avg_out"]
    # verl's "gen" timer wraps generate_sequences, which includes the sharding manager's weight switch;
    # the vendor's "rollout" row does not.
    gen = row["rollout"] + (row["switch"] if with_switch else 0.0)
    timing = {"step": row["step"], "gen": gen, "update_actor": row["update"]}
    switch = {"reshard": row["switch"]} if with_switch else {}
    return reference_step_metrics(timing, total, response, DIES, DIES_PER_CARD, switch)


@pytest.mark.parametrize("with_switch", [True, False])
def test_reproduces_the_true_weight_step_table(with_switch: bool) -> None:
    m = vendor_step(TRUE_WEIGHT, with_switch)
    assert m["perf/system_tokens_per_s_per_card"] == pytest.approx(TRUE_WEIGHT["system"], rel=0.01)
    assert m["perf/system_tokens_per_s_per_die"] == pytest.approx(TRUE_WEIGHT["system"] / 2, rel=0.01)
    assert m["perf/inference_tokens_per_s_per_card"] == pytest.approx(TRUE_WEIGHT["inference"], rel=0.01)
    assert m["perf/training_tokens_per_s_per_card"] == pytest.approx(TRUE_WEIGHT["training"], rel=0.01)
    if with_switch:
        assert m["timing_s/reshard"] == pytest.approx(17.0)
        assert m["timing_s/rollout"] == pytest.approx(TRUE_WEIGHT["rollout"])
    else:
        assert "timing_s/reshard" not in m and "timing_s/rollout" not in m


def test_reproduces_the_random_init_step_table() -> None:
    # (the table's random-init inference figure, 686.8, does not follow from its own rollout time and
    # lengths: 8192 x 3039.8 / 318.27 s / 128 cards = 611; only the system and training rows are checked)
    m = vendor_step(RANDOM_INIT, with_switch=True)
    assert m["perf/system_tokens_per_s_per_card"] == pytest.approx(RANDOM_INIT["system"], rel=0.01)
    assert m["perf/training_tokens_per_s_per_card"] == pytest.approx(RANDOM_INIT["training"], rel=0.01)


def test_missing_timers_give_no_throughput() -> None:
    assert reference_step_metrics({}, 100.0, 50.0, 2, 1, {}) == {}
    m = reference_step_metrics({"step": 2.0}, 100.0, 50.0, 2, 1, {})
    assert m == {"perf/system_tokens_per_s_per_die": 25.0, "perf/system_tokens_per_s_per_card": 25.0}


def test_switch_longer_than_gen_is_clamped_and_gives_no_inference_rate() -> None:
    m = reference_step_metrics({"gen": 1.0}, 10.0, 10.0, 1, 1, {"reshard": 2.0})
    assert m["timing_s/rollout"] == 0.0 and "perf/inference_tokens_per_s_per_card" not in m


# ---- the wrapper around verl's compute_throughout_metrics on a real DataProto ------------------------


def fake_batch(switch_s: float | None):
    from verl.protocol import DataProto

    prompt_len, resp_len = 4, 4
    # 4 prompt columns (left-padded) + 4 response columns (right-padded): 5 + 7 = 12 tokens, 2 + 3 responses
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0]])
    meta = {"global_token_num": attention.sum(-1).tolist()}
    if switch_s is not None:
        meta[TIMING_META_KEY] = {"reshard": switch_s}
    assert attention.shape[1] == prompt_len + resp_len
    return DataProto.from_dict(
        tensors={"attention_mask": attention, "responses": torch.zeros(2, resp_len, dtype=torch.long)}, meta_info=meta
    )


def test_wrapper_adds_reference_keys_and_keeps_verls(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.metric_utils import compute_throughout_metrics

    monkeypatch.setenv(DIES_PER_CARD_ENV, "2")
    original = getattr(compute_throughout_metrics, "__wrapped__", compute_throughout_metrics)
    wrapped = with_reference_metrics(original)
    batch, timing = fake_batch(switch_s=0.5), {"step": 4.0, "gen": 2.5, "update_actor": 1.0}
    verl_only = original(batch, timing, 4)
    m = wrapped(batch, timing, 4)
    for key, value in verl_only.items():  # verl's own keys, unchanged
        assert m[key] == value
    assert {"perf/total_num_tokens", "perf/time_per_step", "perf/throughput"} <= set(verl_only)
    total, response, cards = 12.0, 5.0, 2  # 4 dies / 2 per card
    assert m["perf/system_tokens_per_s_per_die"] == pytest.approx(total / 4.0 / 4)
    assert m["perf/system_tokens_per_s_per_card"] == pytest.approx(total / 4.0 / cards)
    assert m["timing_s/reshard"] == 0.5 and m["timing_s/rollout"] == pytest.approx(2.0)
    assert m["perf/inference_tokens_per_s_per_card"] == pytest.approx(response / 2.0 / cards)
    assert m["perf/training_tokens_per_s_per_card"] == pytest.approx(total / 1.0 / cards)
    assert wrapped.__name__ == original.__name__


def test_wrapper_without_switch_or_env_defaults_to_one_die_per_card(monkeypatch: pytest.MonkeyPatch) -> None:
    from verl.trainer.ppo.metric_utils import compute_throughout_metrics

    monkeypatch.delenv(DIES_PER_CARD_ENV, raising=False)
    original = getattr(compute_throughout_metrics, "__wrapped__", compute_throughout_metrics)
    m = with_reference_metrics(original)(fake_batch(None), {"step": 1.0, "gen": 1.0}, 2)
    assert "timing_s/reshard" not in m
    assert m["perf/system_tokens_per_s_per_card"] == pytest.approx(12.0 / 2)
    assert m["perf/inference_tokens_per_s_per_card"] == pytest.approx(5.0 / 2)


# ---- step_timing: verl's dispatch registration survives, the switch time reaches meta_info --------------


def _registered_generate():
    from verl.single_controller.base.decorator import Dispatch, register

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts):
        with self.rollout_sharding_manager:
            time.sleep(0.01)
        return prompts

    return generate_sequences


def _dispatch_attrs(fn) -> dict:
    return {k: v for k, v in vars(fn).items() if k != "__wrapped__"}


def test_wrapper_keeps_register_attributes_of_a_registered_method() -> None:
    from verl.single_controller.base.decorator import MAGIC_ATTR, Dispatch, Execute

    original = _registered_generate()
    wrapped = report_switch_time(original)
    assert MAGIC_ATTR in vars(original)
    assert _dispatch_attrs(wrapped) == _dispatch_attrs(original)
    attrs = getattr(wrapped, MAGIC_ATTR)
    assert attrs["dispatch_mode"] == Dispatch.DP_COMPUTE_PROTO and attrs["execute_mode"] == Execute.ALL
    assert wrapped.__name__ == "generate_sequences" and wrapped.__wrapped__ is original


def test_wrapper_keeps_register_attributes_of_verls_fsdp_worker() -> None:
    from verl.single_controller.base.decorator import MAGIC_ATTR
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    original = ActorRolloutRefWorker.__dict__["generate_sequences"]
    wrapped = report_switch_time(original)
    assert MAGIC_ATTR in vars(original)
    assert _dispatch_attrs(wrapped) == _dispatch_attrs(original)


class _Manager:
    def __init__(self, enter_s: float) -> None:
        self.enter_s = enter_s

    @timed_enter
    def __enter__(self):
        time.sleep(self.enter_s)
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("attr", ["rollout_sharding_manager", "sharding_manager"])  # FSDP / Megatron workers
def test_switch_time_is_copied_into_meta_info(attr: str) -> None:
    from verl.protocol import DataProto

    class Worker:
        pass

    w = Worker()
    setattr(w, attr, _Manager(0.05))
    if attr == "sharding_manager":
        w.rollout_sharding_manager = None

    def generate(self, prompts):
        with getattr(self, attr):
            pass
        return DataProto.from_dict(tensors={"responses": torch.zeros(2, 3)}, meta_info={"timing": {"gen": 1.0}})

    out = report_switch_time(generate)(w, None)
    switch = out.meta_info[TIMING_META_KEY]["reshard"]
    assert switch == getattr(getattr(w, attr), ATTR)
    assert 0.05 <= switch < 5.0
    assert out.meta_info["timing"] == {"gen": 1.0}  # verl's own meta_info untouched


def test_no_manager_no_meta_key() -> None:
    from verl.protocol import DataProto

    class Worker:
        pass

    out = report_switch_time(lambda self, p: DataProto.from_dict(tensors={"x": torch.zeros(1)}))(Worker(), None)
    assert TIMING_META_KEY not in out.meta_info


def test_timed_enter_records_even_when_enter_fails() -> None:
    class Failing:
        @timed_enter
        def __enter__(self):
            raise RuntimeError("onload failed")

        def __exit__(self, *exc):
            return False

    m = Failing()
    with pytest.raises(RuntimeError):
        with m:
            pass
    assert getattr(m, ATTR) >= 0.0
