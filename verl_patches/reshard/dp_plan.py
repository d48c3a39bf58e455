"""DP re-layout planner (vendor item C2): rollout chunks, one per global rank → Megatron DP layout.

After generation every global rank ``g`` holds chunk ``g`` of the step's batch (rows along dim 0;
verl's vLLM sharding manager hands each TP rank its own chunk back). Megatron wants the batch split into
``dp`` equal contiguous slices, slice ``d`` on every rank whose data-parallel rank is ``d`` (all TP, CP and
PP peers of a DP rank get the same rows). The plan is exactly "concatenate all chunks in global-rank
order, then split into ``dp`` slices": each receiver gets each of its rows once, from the one rank that
produced it. Chunks may be uneven or empty; the destination slices must be equal (as verl's dispatch
requires).

Units are rows. Every rank routes its own overlap through the collective (``always_route_self``) so the
``all_to_all_single`` output, in group-rank order, *is* the destination slice with no extra copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.exchange import RankExchange, Slot
from verl_patches.reshard.layout import MegatronLayout


@dataclass(frozen=True)
class DpRankMap:
    """The Megatron DP rank of every global rank, as the MEGATRON_COMPUTE_PROTO dispatch hands it to the
    workers (B1, ``meta_info["global_megatron_dp_ranks"]``); stands in for a `MegatronLayout` in the plan.

    Every DP rank ``0..dp-1`` must appear, each on the same number of ranks.
    """

    dp_ranks: tuple[int, ...]

    def __post_init__(self) -> None:
        ranks = self.dp_ranks
        if not ranks:
            raise InvalidLayoutError("dp_rank_map_not_empty", "the global Megatron DP rank map is empty")
        dp = max(ranks) + 1
        counts = [ranks.count(d) for d in range(dp)]
        if min(ranks) < 0 or len(set(counts)) != 1:
            raise InvalidLayoutError(
                "dp_rank_map_balanced",
                f"global Megatron DP rank map {list(ranks)}: every DP rank 0..{dp - 1} must appear on the same "
                f"number of ranks (counts {counts})",
            )

    @property
    def world_size(self) -> int:
        return len(self.dp_ranks)

    @property
    def dp(self) -> int:
        return max(self.dp_ranks) + 1

    def dp_rank(self, rank: int) -> int:
        if not 0 <= rank < self.world_size:
            raise InvalidLayoutError("rank_in_range", f"rank {rank} not in [0, {self.world_size})")
        return self.dp_ranks[rank]


@dataclass(frozen=True)
class DpRelayoutPlan:
    """Rows ``chunk_rows[g]`` start on rank ``g``; rank ``r`` ends with slice ``dp_rank(r)``."""

    training: MegatronLayout | DpRankMap
    chunk_rows: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.chunk_rows) != self.training.world_size:
            raise InvalidLayoutError(
                "one_rollout_chunk_per_rank",
                f"{len(self.chunk_rows)} rollout chunks for world size {self.training.world_size}: the "
                f"rollout must leave exactly one chunk on every global rank",
            )
        if any(n < 0 for n in self.chunk_rows):
            raise InvalidLayoutError("chunk_rows_non_negative", f"negative chunk size in {self.chunk_rows}")
        if self.total_rows % self.training.dp:
            raise InvalidLayoutError(
                "batch_divisible_by_megatron_dp",
                f"global batch of {self.total_rows} rows is not divisible by the Megatron "
                f"data-parallel size {self.training.dp}",
            )

    @cached_property
    def chunk_starts(self) -> tuple[int, ...]:
        return (0,) + tuple(accumulate(self.chunk_rows))[:-1]

    @property
    def total_rows(self) -> int:
        return sum(self.chunk_rows)

    @property
    def rows_per_dp_rank(self) -> int:
        return self.total_rows // self.training.dp

    def target_range(self, rank: int) -> range:
        """Rows of the concatenated batch that ``rank`` holds after the re-layout."""
        d = self.training.dp_rank(rank)
        n = self.rows_per_dp_rank
        return range(d * n, (d + 1) * n)

    def source_range(self, rank: int) -> range:
        start = self.chunk_starts[rank]
        return range(start, start + self.chunk_rows[rank])

    @cached_property
    def is_identity(self) -> bool:
        """Every rank already holds exactly its slice (world == dp, equal chunks): nothing to move."""
        return all(self.source_range(r) == self.target_range(r) for r in range(self.training.world_size))

    def rank_exchange(self, rank: int) -> RankExchange:
        mine = self.source_range(rank)
        want = self.target_range(rank)
        sends, recvs = [], []
        self_src = self_dst = None
        self_count = 0
        for peer in range(self.training.world_size):
            out = _overlap(mine, self.target_range(peer))
            inc = _overlap(self.source_range(peer), want)
            if peer == rank:
                if out:
                    self_src, self_dst, self_count = out.start - mine.start, out.start - want.start, len(out)
                continue
            if out:
                sends.append(Slot(peer, out.start - mine.start, len(out)))
            if inc:
                recvs.append(Slot(peer, inc.start - want.start, len(inc)))
        return RankExchange(rank, tuple(sends), tuple(recvs), self_src, self_dst, self_count, always_route_self=True)

    def all_exchanges(self) -> list[RankExchange]:
        return [self.rank_exchange(r) for r in range(self.training.world_size)]


def _overlap(a: range, b: range) -> range:
    return range(max(a.start, b.start), max(max(a.start, b.start), min(a.stop, b.stop)))


def plan_dp_relayout(training: MegatronLayout | DpRankMap, chunk_rows: Sequence[int]) -> DpRelayoutPlan:
    """Plan moving one rollout chunk per global rank into Megatron's data-parallel layout."""
    return DpRelayoutPlan(training, tuple(int(n) for n in chunk_rows))


def equal_chunk_rows(global_rows: int, world_size: int) -> tuple[int, ...]:
    """Chunk sizes when verl split ``global_rows`` evenly over the world (the rollout's layout)."""
    if global_rows % world_size:
        raise InvalidLayoutError(
            "batch_divisible_by_world",
            f"global batch of {global_rows} rows is not divisible by world size {world_size}",
        )
    return (global_rows // world_size,) * world_size
