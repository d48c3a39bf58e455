"""Cost model of the three reshards: bytes per rank, peak extra memory, collective calls.

Every figure is per rank and per unit of work (one expert weight of one MoE layer; one batch tensor; one
pipeline exchange). Definitions, used identically for every path:

* ``sent`` / ``received``: bytes that cross between *different* ranks (a rank's own data never counts).
* ``peak_extra``: bytes the reshard allocates and holds at its peak: temporary send buffers plus receive
  buffers. Views of data the rank already has (its training weights, the slices it keeps) cost nothing.
* ``calls``: collective calls each rank makes.

Paths compared:

* ``ours``: read from the same plan objects the executors run (`ExpertReshardPlan`, `DpRelayoutPlan`,
  `PpGatherPlan`), so measured bytes equal predicted bytes by construction *and* by test.
* ``vendor all-gather``: the vendor's fallback expert path (``NO_ALL_TO_ALL_RESHARD=1``): all-gather the
  expert shard over the training TP×EP group, keep the experts the rollout rank serves. With
  ``holder_stage`` set, the PP broadcast that precedes it in the vendor's loop is added
  (``include_pp_broadcast``).
* ``vendor all-to-all-v``: the vendor's routing (after its PP broadcast, source inside the receiver's
  TP×EP group, one call), modelled with our planner under the vendor's own constraints.
* ``lower bound``: every rank receives exactly the bytes it must hold and does not already hold, its
  extra memory is exactly those bytes, one call; for ``max_sent`` the pigeonhole bound over the ranks
  that hold each expert block.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from math import ceil

from verl_patches.reshard.dp_plan import DpRelayoutPlan
from verl_patches.reshard.ep_plan import (
    ExpertDims,
    ExpertReshardPlan,
    ExpertWeight,
    check_vendor_alltoallv_constraints,
    plan_expert_reshard,
)
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.reshard.pp_plan import PpGatherPlan, dtype_bytes

GIB = 2**30


@dataclass(frozen=True)
class RankCost:
    sent: int = 0
    received: int = 0
    staging: int = 0
    receive_buffer: int = 0

    @property
    def peak_extra(self) -> int:
        return self.staging + self.receive_buffer


@dataclass(frozen=True)
class PathCost:
    path: str
    per_rank: tuple[RankCost, ...]
    calls: int
    max_sent_override: int | None = field(default=None, compare=False)

    @property
    def max_sent(self) -> int:
        if self.max_sent_override is not None:
            return self.max_sent_override
        return max(c.sent for c in self.per_rank)

    @property
    def max_received(self) -> int:
        return max(c.received for c in self.per_rank)

    @property
    def max_peak_extra(self) -> int:
        return max(c.peak_extra for c in self.per_rank)

    @property
    def total_moved(self) -> int:
        return sum(c.received for c in self.per_rank)


def expert_unit_bytes(dims: ExpertDims, kind: ExpertWeight, dtype: str = "bfloat16") -> int:
    return dims.expert_numel(kind) * dtype_bytes(dtype)


# ----------------------------------------------------------------------------------------- experts


def ep_plan_cost(
    plan: ExpertReshardPlan, dims: ExpertDims, kind: ExpertWeight, dtype: str = "bfloat16", path: str = "ours"
) -> PathCost:
    unit = expert_unit_bytes(dims, kind, dtype)
    world = plan.training.world_size
    sent, recv, buf, stage = [0] * world, [0] * world, [0] * world, [0] * world
    for rnd in range(plan.num_rounds):
        for ex in plan.exchanges(rnd):
            r = ex.rank
            sent[r] += ex.units_sent * unit
            recv[r] += ex.units_received * unit
            buf[r] += ex.receive_buffer_units * unit
            stage[r] = max(stage[r], ex.staging_units * unit)
    per_rank = tuple(RankCost(sent[r], recv[r], stage[r], buf[r]) for r in range(world))
    return PathCost(path, per_rank, plan.num_rounds)


def _pp_broadcast(training: MegatronLayout, holder_stage: int | None, shard: int) -> tuple[list[int], list[int], int]:
    """Per-rank (sent, received) of broadcasting each rank's shard from the owning stage, and calls."""
    world = training.world_size
    if holder_stage is None or training.pp == 1:
        return [0] * world, [0] * world, 0
    sent = [shard * (training.pp - 1) if training.pp_rank(r) == holder_stage else 0 for r in range(world)]
    recv = [0 if training.pp_rank(r) == holder_stage else shard for r in range(world)]
    return sent, recv, 1


def ep_allgather_cost(
    training: MegatronLayout,
    num_experts: int,
    dims: ExpertDims,
    kind: ExpertWeight,
    holder_stage: int | None = None,
    dtype: str = "bfloat16",
) -> PathCost:
    """Vendor fallback: (optional PP broadcast, then) all-gather over TP×EP and slice."""
    unit = expert_unit_bytes(dims, kind, dtype)
    n_local = training.local_experts(num_experts)
    shard, t = n_local * unit, training.tp_ep_size
    b_sent, b_recv, b_calls = _pp_broadcast(training, holder_stage, shard)
    per_rank = []
    for r in range(training.world_size):
        bcast_buffer = shard if b_recv[r] else 0
        per_rank.append(
            RankCost(
                sent=b_sent[r] + (t - 1) * shard,
                received=b_recv[r] + (t - 1) * shard,
                receive_buffer=bcast_buffer + t * shard,
            )
        )
    path = "vendor all-gather" + (" + PP broadcast" if b_calls else "")
    return PathCost(path, tuple(per_rank), 1 + b_calls)


def ep_vendor_alltoallv_cost(
    training: MegatronLayout,
    rollout: RolloutLayout,
    num_experts: int,
    dims: ExpertDims,
    kind: ExpertWeight,
    holder_stage: int | None = None,
    dtype: str = "bfloat16",
) -> PathCost:
    """Vendor all-to-all-v: (optional PP broadcast, then) one call on the TP×EP group."""
    check_vendor_alltoallv_constraints(training, rollout, num_experts)
    plan = plan_expert_reshard(training, rollout, num_experts, None, "tp_ep_group", "single")
    core = ep_plan_cost(plan, dims, kind, dtype)
    shard = training.local_experts(num_experts) * expert_unit_bytes(dims, kind, dtype)
    b_sent, b_recv, b_calls = _pp_broadcast(training, holder_stage, shard)
    per_rank = tuple(
        RankCost(c.sent + b_sent[r], c.received + b_recv[r], c.staging, c.receive_buffer + (shard if b_recv[r] else 0))
        for r, c in enumerate(core.per_rank)
    )
    path = "vendor all-to-all-v" + (" + PP broadcast" if b_calls else "")
    return PathCost(path, per_rank, core.calls + b_calls)


def ep_lower_bound(
    training: MegatronLayout,
    rollout: RolloutLayout,
    num_experts: int,
    dims: ExpertDims,
    kind: ExpertWeight,
    holder_stage: int | None,
    dtype: str = "bfloat16",
) -> PathCost:
    unit = expert_unit_bytes(dims, kind, dtype)
    n_local = training.local_experts(num_experts)
    holders = range(training.world_size) if holder_stage is None else training.stage_ranks(holder_stage)
    holders_per_block = Counter(training.expert_block(h) for h in holders)
    held = {h: set(training.experts_of_rank(h, num_experts)) for h in holders}
    moved_per_block: Counter[int] = Counter()
    per_rank = []
    for g in range(rollout.world_size):
        missing = [e for e in rollout.owned_experts(g, num_experts) if e not in held.get(g, ())]
        for e in missing:
            moved_per_block[e // n_local] += 1
        per_rank.append(RankCost(received=len(missing) * unit, receive_buffer=len(missing) * unit))
    max_sent = max((ceil(moved_per_block[b] / holders_per_block[b]) for b in moved_per_block), default=0)
    return PathCost("lower bound", tuple(per_rank), 1, max_sent_override=max_sent * unit)


# ----------------------------------------------------------------------------------------- batch


def dp_plan_cost(plan: DpRelayoutPlan, row_bytes: int, path: str = "ours") -> PathCost:
    per_rank = []
    for ex in plan.all_exchanges():
        per_rank.append(
            RankCost(
                ex.units_sent * row_bytes,
                ex.units_received * row_bytes,
                ex.staging_units * row_bytes,
                ex.receive_buffer_units * row_bytes,
            )
        )
    return PathCost(path, tuple(per_rank), 1)


def dp_allgather_cost(plan: DpRelayoutPlan, row_bytes: int) -> PathCost:
    """Gather every chunk on every rank, then slice (what a collect-and-dispatch amounts to)."""
    total = plan.total_rows * row_bytes
    world = plan.training.world_size
    per_rank = tuple(
        RankCost(
            sent=plan.chunk_rows[r] * row_bytes * (world - 1),
            received=total - plan.chunk_rows[r] * row_bytes,
            receive_buffer=total,
        )
        for r in range(world)
    )
    return PathCost("all-gather + slice", per_rank, 1)


def dp_lower_bound(plan: DpRelayoutPlan, row_bytes: int) -> PathCost:
    """Each row lives on one rank, so it must leave that rank once per other rank that needs it."""
    world = plan.training.world_size
    per_rank = []
    for r in range(world):
        want, mine = plan.target_range(r), plan.source_range(r)
        own = len(_overlap(want, mine))
        must_send = sum(len(_overlap(mine, plan.target_range(p))) for p in range(world) if p != r)
        per_rank.append(
            RankCost(
                sent=must_send * row_bytes, received=(len(want) - own) * row_bytes, receive_buffer=len(want) * row_bytes
            )
        )
    return PathCost("lower bound", tuple(per_rank), 1)


def _overlap(a: range, b: range) -> range:
    lo = max(a.start, b.start)
    return range(lo, max(lo, min(a.stop, b.stop)))


# ----------------------------------------------------------------------------------------- pipeline


def pp_plan_cost(plan: PpGatherPlan, world_size: int) -> PathCost:
    """Bucketed all-gather over the PP group (per rank; every rank of a stage does the same)."""
    p, stage_bytes = plan.pp, plan.stage_eligible_bytes
    max_bucket = max((plan.bucket_bytes(b) for b in range(len(plan.buckets))), default=0)
    multi = [plan.bucket_bytes(b) for b, (s, e) in enumerate(plan.buckets) if e - s > 1]
    cost = RankCost(
        sent=(p - 1) * stage_bytes,
        received=(p - 1) * stage_bytes,
        staging=max(multi, default=0),
        receive_buffer=p * max_bucket,
    )
    return PathCost("ours (bucketed)", (cost,) * world_size, len(plan.buckets))


def pp_vendor_cost(plan: PpGatherPlan, world_size: int) -> PathCost:
    """Vendor E3: per eligible parameter, one name all_gather_object and one all-to-all."""
    p, stage_bytes = plan.pp, plan.stage_eligible_bytes
    max_param = max((plan.numel(i) * dtype_bytes(plan.dtypes[i]) for i in range(len(plan.shapes))), default=0)
    cost = RankCost(sent=(p - 1) * stage_bytes, received=(p - 1) * stage_bytes, receive_buffer=p * max_param)
    return PathCost("vendor per-parameter all-to-all", (cost,) * world_size, 2 * len(plan.shapes))


def pp_lower_bound(plan: PpGatherPlan, world_size: int) -> PathCost:
    """Every other stage's eligible bytes must arrive; at least the largest one must be materialised."""
    b = (plan.pp - 1) * plan.stage_eligible_bytes
    largest = max((plan.numel(i) * dtype_bytes(plan.dtypes[i]) for i in range(len(plan.shapes))), default=0)
    return PathCost("lower bound", (RankCost(received=b, receive_buffer=largest),) * world_size, 1, max_sent_override=b)
