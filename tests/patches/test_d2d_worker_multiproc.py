"""The D2D cache's reshard through the worker-side code path (our wrappers on a fake worker), over gloo on
4 CPU processes: rollout chunks one per rank (DP = world = 4) into Megatron DP = 2 with a non-contiguous
rank map ([0, 1, 0, 1]: dp fastest, as with PP2 at TP1 in the order tp-cp-ep-dp-pp) and with the
contiguous map of TP2 ([0, 0, 1, 1]). What ref and update receive equals the driver's concat of the
generate outputs split into DP slices (the upstream dataflow without D2D); each step leaves the cache
empty."""

from __future__ import annotations

import pytest
import torch

from tests.reshard.dist_harness import run_scenario_ranks, run_scenarios

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

WORLD, ROWS = 4, 3  # rows of each rank's rollout chunk (12 in all, 6 per Megatron DP rank)
MAPS = {"dp_fastest": [0, 1, 0, 1], "tp_fastest": [0, 0, 1, 1]}


def _step(rank: int, world: int, dp_ranks: list[int], step: int) -> None:
    from verl import DataProto

    from d2d_fake_worker import ROLLOUT_KEYS, FakeWorker, ref_log_prob_of, rollout_chunk
    from verl_patches.patches.verl.workers.d2d_cache import cache_of
    from verl_patches.worker_calls.meta_keys import DP_RANKS_META_KEY
    from verl_patches.worker_calls.step_payloads import ref_payload, stamp, update_payload

    w = FakeWorker(rank, world, ROWS)
    dp = max(dp_ranks) + 1
    d = dp_ranks[rank]
    full = {k: torch.cat([rollout_chunk(r, ROWS)[k] for r in range(world)]) for k in ROLLOUT_KEYS}
    mine = {k: v.chunk(dp)[d] for k, v in full.items()}  # the driver's split for this DP rank

    gen_in = stamp(DataProto.from_dict({"input_ids": torch.zeros(1, 1)}), step, True)
    gen_out = w.generate_sequences(gen_in)
    # the driver: concat of every rank's output (only the keys it gets), advantages, then the DP split
    outs = [{k: v for k, v in rollout_chunk(r, ROWS).items() if k in gen_out.batch.keys()} for r in range(world)]
    batch = DataProto.concat([DataProto.from_dict(o) for o in outs])
    batch.batch["advantages"] = torch.arange(world * ROWS, dtype=torch.float32)[:, None].expand(-1, 2).clone()
    batch.meta_info["global_token_num"] = [1] * (world * ROWS)

    ref_in = stamp(ref_payload(batch, True), step, True).chunk(dp)[d]
    ref_in.meta_info[DP_RANKS_META_KEY] = dp_ranks
    ref_out = w.compute_ref_log_prob(ref_in)
    assert len(ref_out) == world * ROWS // dp and list(ref_out.batch.keys()) == []
    for k in ("responses", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(w.seen["ref"][k], mine[k]), (rank, k)

    upd_in = stamp(update_payload(batch, True), step, True).chunk(dp)[d]
    upd_in.meta_info[DP_RANKS_META_KEY] = dp_ranks
    w.update_actor(upd_in)
    seen = w.seen["update"]
    for k in ("responses", "input_ids", "attention_mask", "position_ids", "rollout_log_probs"):
        assert torch.equal(seen[k], mine[k]), (rank, k)
    assert torch.equal(seen["ref_log_prob"], ref_log_prob_of(mine["input_ids"]))
    assert torch.equal(seen["advantages"], batch.batch["advantages"].chunk(dp)[d])
    assert len(cache_of(w)) == 0


def _scenarios(rank: int, world: int) -> dict[str, str]:
    return run_scenarios(
        {name: (lambda r, w, m=m: [_step(r, w, m, s) for s in (1, 2)]) for name, m in MAPS.items()}, rank, world
    )


def _target(rank: int, world: int) -> dict[str, str]:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))  # d2d_fake_worker, as pytest's rootdir import finds it
    return _scenarios(rank, world)


@pytest.fixture(scope="module")
def results() -> list[dict[str, str]]:
    return run_scenario_ranks(_target, WORLD, timeout_s=120.0)


@pytest.mark.parametrize("scenario", sorted(MAPS))
def test_reshard_through_the_worker_path_equals_the_drivers_split(results: list[dict[str, str]], scenario: str) -> None:
    for rank, res in enumerate(results):
        assert res[scenario] == "ok", f"rank {rank}: {res[scenario]}"
