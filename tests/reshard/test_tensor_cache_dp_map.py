"""TensorCache with the dispatch's Megatron DP rank map (B1): adopted before anything is resharded, refused
once entries sit in another DP layout or when its world size differs; the reshard then follows the map."""

from __future__ import annotations

import pytest
import torch

from verl_patches.reshard.dp_plan import DpRankMap
from verl_patches.reshard.errors import InvalidLayoutError, PlanMismatchError
from verl_patches.reshard.tensor_cache import TensorCache


def recording_relayout(calls: list):
    def relayout(plan, rank, tensor, group=None):
        calls.append((plan.training.dp_ranks, rank))
        d = plan.training.dp_rank(rank)
        return torch.arange(plan.total_rows).chunk(plan.training.dp)[d].clone()

    return relayout


def test_the_map_from_the_dispatch_decides_the_slice() -> None:
    calls: list = []
    cache = TensorCache(DpRankMap((0, 1, 2, 3)), rank=1, global_rows=8, relayout=recording_relayout(calls))
    cache.put("x", torch.zeros(2))
    assert cache.rows_per_dp_rank == 2
    got = cache.get(["x"], dp_ranks=[0, 1, 0, 1]).batch["x"]
    assert calls == [((0, 1, 0, 1), 1)] and torch.equal(got, torch.arange(4, 8))
    assert cache.rows_per_dp_rank == 4 and cache.layout_of("x") == "megatron_dp"
    cache.get(["x"], dp_ranks=[0, 1, 0, 1])  # the same map again: nothing moves
    assert len(calls) == 1
    with pytest.raises(PlanMismatchError, match=r"changed to \[0, 0, 1, 1\].*\['x'\]"):
        cache.set_dp_rank_map([0, 0, 1, 1])
    cache.clear()
    cache.set_dp_rank_map([0, 0, 1, 1])  # nothing held in the old layout: fine
    assert cache.dp_ranks() == (0, 0, 1, 1)


def test_a_map_of_another_world_or_unbalanced_is_refused() -> None:
    cache = TensorCache(DpRankMap((0, 1)), rank=0, global_rows=4)
    with pytest.raises(PlanMismatchError, match="4 entries.*world size 2"):
        cache.set_dp_rank_map([0, 0, 1, 1])
    with pytest.raises(InvalidLayoutError, match="dp_rank_map_balanced"):
        cache.set_dp_rank_map([1, 1])


def test_cache_tensors_moves_the_cached_copies_and_checks_rows_first() -> None:
    from verl import DataProto

    cache = TensorCache(DpRankMap((0,)), rank=0, global_rows=3)
    data = DataProto.from_dict({"a": torch.zeros(3, 2), "b": torch.ones(3)})
    cache.cache_tensors(data, keys_to_reserve=["b"], device=torch.device("cpu"))
    assert sorted(cache.keys()) == ["a", "b"] and list(data.batch.keys()) == ["b"]
    two_ranks = TensorCache(DpRankMap((0, 1)), rank=0, global_rows=6)  # 3 rows per rollout chunk
    with pytest.raises(PlanMismatchError, match="rank 0: 'c' has 2 rows, a rollout entry must have 3"):
        two_ranks.cache_tensors(DataProto.from_dict({"c": torch.zeros(2), "e": torch.zeros(2)}))
    assert len(two_ranks) == 0  # nothing half-cached
