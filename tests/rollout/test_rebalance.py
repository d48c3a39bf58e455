"""F5 parts that run without vLLM's scheduler: the planner (property-tested), hooks on a dummy engine
class, metadata round trips (pickle, and a 3-rank gloo exchange with uneven sizes), and recovery of
migrated outputs into their parent requests."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.multirank import run_ranks
from verl_patches.rollout.rebalance import hooks, metadata, planner, recover

SIZES = planner.graph_batch_sizes(64, [64, 32, 16, 8, 4])


def test_graph_sizes_and_buckets() -> None:
    assert SIZES == [64, 32, 16, 8, 4]
    assert planner.graph_batch_sizes(48, [64, 32, 16]) == [48, 32, 16]
    assert [planner.bucket(c, SIZES) for c in (0, 4, 5, 17, 64)] == [4, 4, 8, 32, 64]
    with pytest.raises(ValueError, match="65 running requests exceed"):
        planner.bucket(65, SIZES)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 64), min_size=1, max_size=32))
def test_planner_properties(counts: list[int]) -> None:
    requests = {r: [f"r{r}-{i}" for i in range(c)] for r, c in enumerate(counts)}
    tasks = planner.calc_balancing_tasks(requests, SIZES)
    target = planner.target_size(counts, SIZES)
    after = planner.apply_tasks(requests, tasks)
    assert sorted(sum(after.values(), [])) == sorted(sum(requests.values(), []))  # nothing lost or duplicated
    if target is None:
        assert tasks == []
        return
    assert all(len(ids) <= target for ids in after.values())  # every rank fits the smaller graph
    assert sum(len(t.request_ids) for t in tasks) == sum(max(0, c - target) for c in counts)  # moves = surplus
    received: dict[int, int] = {}
    for t in tasks:
        assert counts[t.src] > target and counts[t.dst] < target and t.request_ids
        received[t.dst] = received.get(t.dst, 0) + len(t.request_ids)
    assert all(counts[d] + n <= target for d, n in received.items())  # no receiver over capacity
    assert planner.bucket(max(len(v) for v in after.values()), SIZES) < planner.bucket(max(counts), SIZES)


def test_no_tasks_when_the_largest_bucket_is_already_minimal() -> None:
    assert planner.calc_balancing_tasks({0: ["a"] * 4, 1: ["b"]}, SIZES) == []
    assert planner.calc_balancing_tasks({0: [f"a{i}" for i in range(40)], 1: [f"b{i}" for i in range(40)]}, SIZES) == []


def test_donors_are_taken_round_robin_and_surplus_is_the_newest() -> None:
    requests = {0: [f"a{i}" for i in range(20)], 1: [f"b{i}" for i in range(20)], 2: [], 3: []}
    tasks = planner.calc_balancing_tasks(requests, SIZES)  # mean 10 -> target 16: 4 + 4 move
    assert [(t.src, t.dst, t.request_ids) for t in tasks] == [
        (0, 2, ("a16", "a17", "a18", "a19")),
        (1, 2, ("b16", "b17", "b18", "b19")),
    ]


class Engine:
    def __init__(self) -> None:
        self.log: list[str] = []

    def step(self, x: int) -> int:
        self.log.append(f"step {x}")
        return x * 2


def test_hooks_wrap_and_unwrap_a_class_method() -> None:
    hooks.before(Engine, "step", lambda self, x: self.log.append(f"before {x}"))
    hooks.after(Engine, "step", lambda self, result, x: self.log.append(f"after {result}"))
    hooks.after(Engine, "step", lambda self, result, x: result + 1 if x == 5 else None)
    try:
        e = Engine()
        assert e.step(3) == 6 and e.step(5) == 11
        assert e.log == ["before 3", "step 3", "after 6", "before 5", "step 5", "after 10"]
        assert hooks.is_hooked(Engine, "step") and Engine.step.__name__ == "step"
    finally:
        hooks.remove(Engine, "step")
    assert not hooks.is_hooked(Engine, "step") and Engine().step(5) == 10


def test_metadata_pickle_round_trip() -> None:
    meta = {"prompt": [1, 2, 3], "output": [7, 8], "max_tokens": 3072, "logprobs": [{7: -0.5}], "t": 1.5}
    t = metadata.pack(meta)
    assert t.dtype.itemsize == 1 and metadata.unpack(t) == meta


def _exchange(rank: int, world: int) -> list:
    out = [
        None if dst == rank else {"from": rank, "to": dst, "ids": list(range(rank * 7 + dst))} for dst in range(world)
    ]
    return metadata.exchange(out)


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_metadata_exchange_over_gloo_with_uneven_sizes() -> None:
    for rank, received in enumerate(run_ranks(_exchange, 3, 100)):
        assert received[rank] is None
        for src in range(3):
            if src != rank:
                assert received[src] == {"from": src, "to": rank, "ids": list(range(src * 7 + rank))}


def test_recover_returns_migrated_children_to_their_parent() -> None:
    Completion, Output = recover.Completion, recover.Output
    # rank 0 ran request "req-1" with n=3; children 1 and 2 migrated to rank 1.
    on_rank1 = [
        Output(recover.migrated_id(0, "1_req-1"), [5], [Completion(0, [11])]),
        Output(recover.migrated_id(0, "2_req-1"), [5], [Completion(0, [12])]),
        Output("req-9", [6], [Completion(0, [9])]),
    ]
    own1, back = recover.split_migrated(on_rank1)
    assert [o.request_id for o in own1] == ["req-9"] and list(back) == [0]
    own0 = [
        Output("0_req-1", [5], [Completion(0, [10])]),
        Output("req-2", [4], [Completion(0, [20]), Completion(1, [21])]),
    ]
    merged = recover.regroup(own0, back[0], order=["req-1", "req-2"])
    assert [o.request_id for o in merged] == ["req-1", "req-2"]
    assert [(c.index, c.token_ids) for c in merged[0].outputs] == [(0, [10]), (1, [11]), (2, [12])]
    with pytest.raises(RuntimeError, match="lost request"):
        recover.regroup(own0, [], order=["req-1", "req-2", "req-3"])
