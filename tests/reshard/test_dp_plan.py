"""DP re-layout planner: equal to concatenate-then-split, each row received once, bytes at the bound."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reshard.sim import simulate_all_to_all
from verl_patches.reshard.cost_model import dp_allgather_cost, dp_lower_bound, dp_plan_cost
from verl_patches.reshard.dp_plan import equal_chunk_rows, plan_dp_relayout
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, production_training_layout

ORDERS = ["tp-cp-ep-dp-pp", "tp-pp-dp", "pp-dp-tp", "ep-dp-tp-pp-cp", "cp-tp-dp-ep-pp"]


@st.composite
def layouts_and_chunks(draw):
    while True:
        tp, pp, cp = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2]))
        ep, dpm = draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 3]))
        order = draw(st.sampled_from(ORDERS))
        try:
            lay = MegatronLayout(tp * pp * cp * ep * dpm, tp, pp, ep, cp, order)
            break
        except InvalidLayoutError:
            continue
    per_dp = draw(st.integers(0, 5))
    total = per_dp * lay.dp
    # Uneven chunks, zeros allowed: cut [0, total) at random points.
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=lay.world_size - 1, max_size=lay.world_size - 1)))
    bounds = [0] + cuts + [total]
    return lay, [b - a for a, b in zip(bounds, bounds[1:])]


def reference(lay, chunks):
    full = torch.cat(chunks)
    return [full.chunk(lay.dp)[lay.dp_rank(r)] if full.numel() else full for r in range(lay.world_size)]


@settings(max_examples=150, deadline=None)
@given(layouts_and_chunks())
def test_equals_concat_then_split_and_meets_the_bound(case):
    lay, rows = case
    plan = plan_dp_relayout(lay, rows)
    chunks = []
    start = 0
    for n in rows:
        chunks.append(torch.arange(start, start + n).unsqueeze(1).repeat(1, 3))
        start += n
    exchanges = plan.all_exchanges()
    out = simulate_all_to_all(exchanges, chunks)
    for r, (got, want) in enumerate(zip(out, reference(lay, chunks))):
        assert torch.equal(got, want), r
    ours, bound = dp_plan_cost(plan, 24), dp_lower_bound(plan, 24)
    assert [c.received for c in ours.per_rank] == [c.received for c in bound.per_rank]
    assert [c.receive_buffer for c in ours.per_rank] == [c.receive_buffer for c in bound.per_rank]


def test_sources_are_the_global_ranks_in_order_with_micro_slots():
    # Vendor C2 shape: W=8, 2 rows each; dp=4 (tp2, order tp-cp-ep-dp-pp): receiver d gets ranks 2d, 2d+1.
    lay = MegatronLayout(8, tp=2, pp=1)
    plan = plan_dp_relayout(lay, [2] * 8)
    for r in range(8):
        ex = plan.rank_exchange(r)
        peers = sorted([s.peer for s in ex.recvs] + ([r] if ex.has_self else []))
        assert peers == [2 * lay.dp_rank(r), 2 * lay.dp_rank(r) + 1]
    # non-contiguous: dp before tp → DP rank d on ranks {d, d+4}
    lay = MegatronLayout(8, tp=2, pp=1, order="dp-tp")
    plan = plan_dp_relayout(lay, [2] * 8)
    assert [lay.dp_rank(r) for r in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [s.peer for s in plan.rank_exchange(4).recvs] == [0, 1]


def test_production_batch_relayout_costs():
    lay = production_training_layout()
    plan = plan_dp_relayout(lay, equal_chunk_rows(8192, 256))
    assert plan.rows_per_dp_rank == 1024
    row = 4096 * 8  # one int64 sequence of 4096 tokens
    ours, bound, gather = dp_plan_cost(plan, row), dp_lower_bound(plan, row), dp_allgather_cost(plan, row)
    assert ours.max_received == 1024 * row  # most ranks hold none of their slice
    assert ours.per_rank[0].received == 992 * row  # rank 0 keeps its own 32 rows of slice 0
    assert [c.received for c in ours.per_rank] == [c.received for c in bound.per_rank]
    assert gather.max_peak_extra == 8192 * row and ours.max_peak_extra < gather.max_peak_extra


@pytest.mark.parametrize(
    "rows,condition",
    [
        ([2] * 7, "one_rollout_chunk_per_rank"),
        ([1] * 7 + [2], "batch_divisible_by_megatron_dp"),
    ],
)
def test_invalid_batches(rows, condition):
    with pytest.raises(InvalidLayoutError) as e:
        plan_dp_relayout(MegatronLayout(8, tp=2, pp=1), rows)
    assert e.value.condition == condition


def test_equal_chunks_need_divisible_batch():
    with pytest.raises(InvalidLayoutError) as e:
        equal_chunk_rows(10, 4)
    assert e.value.condition == "batch_divisible_by_world"


def test_identity_plan_when_world_equals_dp():
    assert plan_dp_relayout(MegatronLayout(4, tp=1, pp=1), [3] * 4).is_identity
    assert not plan_dp_relayout(MegatronLayout(4, tp=1, pp=1), [2, 4, 3, 3]).is_identity
    assert not plan_dp_relayout(production_training_layout(), equal_chunk_rows(8192, 256)).is_identity
