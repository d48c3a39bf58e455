"""Thin executors: turn a plan into ``torch.distributed`` calls on the process group the caller passes.

All expert and batch traffic goes through ``all_to_all_single`` with split sizes (gloo, NCCL and HCCL
all implement it); the pipeline exchange is an all-gather by nature (every stage's tensor goes to every
peer), so it uses the all-gather collective rather than an all-to-all whose input would hold ``pp``
copies of the same tensor.

The process group decides who talks: pass the world group (``None``) or, for an expert plan whose every
transfer stays inside one TP×EP group, that group. Group ranks must be ascending global ranks (what
``torch.distributed.new_group`` produces); a plan peer outside the group is a `PlanMismatchError`.

A ``recorder`` callable, when given, receives a `CollectiveRecord` for every call with the exact split
sizes passed, so a benchmark can count the bytes the executor really moves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl_patches.reshard.dp_plan import DpRelayoutPlan
from verl_patches.reshard.ep_plan import ExpertDims, ExpertReshardPlan, ExpertWeight
from verl_patches.reshard.errors import PlanMismatchError
from verl_patches.reshard.exchange import RankExchange, SendStaging
from verl_patches.reshard.pp_plan import PpGatherPlan, dtype_bytes


@dataclass(frozen=True)
class CollectiveRecord:
    op: str
    rank: int
    group_ranks: tuple[int, ...]
    send_bytes: tuple[int, ...]  # bytes this rank sends to each group rank (self included)
    recv_bytes: tuple[int, ...]

    @property
    def bytes_sent_to_peers(self) -> int:
        return sum(b for g, b in zip(self.group_ranks, self.send_bytes) if g != self.rank)

    @property
    def bytes_received_from_peers(self) -> int:
        return sum(b for g, b in zip(self.group_ranks, self.recv_bytes) if g != self.rank)


Recorder = Callable[[CollectiveRecord], None]


def group_ranks(group: dist.ProcessGroup | None) -> list[int]:
    ranks = list(range(dist.get_world_size())) if group is None else list(dist.get_process_group_ranks(group))
    if ranks != sorted(ranks):
        raise PlanMismatchError(f"process group ranks {ranks} are not ascending global ranks")
    return ranks


def exchange_units(
    ex: RankExchange, source: torch.Tensor, group: dist.ProcessGroup | None = None, recorder: Recorder | None = None
) -> torch.Tensor:
    """Run one rank's part of an all-to-all-v; units live on dim 0 of ``source``.

    Returns the receive buffer: the collective's receive slots concatenated in group-rank order.
    """
    ranks = group_ranks(group)
    where = {g: i for i, g in enumerate(ranks)}
    sends, recvs = ex.collective_sends(), ex.collective_recvs()
    for slot in sends + recvs:
        if slot.peer not in where:
            raise PlanMismatchError(
                f"rank {ex.rank}: plan peer {slot.peer} is not in the process group "
                f"{ranks}; pass a group that contains every peer (e.g. the world)"
            )
    in_splits, out_splits = [0] * len(ranks), [0] * len(ranks)
    for s in sends:
        in_splits[where[s.peer]] = s.count
    for s in recvs:
        out_splits[where[s.peer]] = s.count
    total = sum(in_splits)
    if ex.staging is SendStaging.PACK:
        inp = torch.cat([source.narrow(0, s.offset, s.count) for s in sends])
    else:
        inp = source.narrow(0, sends[0].offset if sends else 0, total)
    out = source.new_empty((sum(out_splits), *source.shape[1:]))
    if recorder is not None:
        unit = source.element_size() * math.prod(source.shape[1:])
        recorder(
            CollectiveRecord(
                "all_to_all_single",
                ex.rank,
                tuple(ranks),
                tuple(n * unit for n in in_splits),
                tuple(n * unit for n in out_splits),
            )
        )
    dist.all_to_all_single(out, inp.contiguous(), out_splits, in_splits, group=group)
    return out


# ----------------------------------------------------------------------------------------- batch


def relayout_rows(
    plan: DpRelayoutPlan,
    rank: int,
    local_chunk: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    recorder: Recorder | None = None,
) -> torch.Tensor:
    """This rank's rollout chunk in, its Megatron data-parallel slice out (rows on dim 0)."""
    if local_chunk.shape[0] != plan.chunk_rows[rank]:
        raise PlanMismatchError(
            f"rank {rank}: local chunk has {local_chunk.shape[0]} rows, the plan expects {plan.chunk_rows[rank]}"
        )
    ex = plan.rank_exchange(rank)
    out = exchange_units(ex, local_chunk, group, recorder)
    offsets = [s.offset for s in ex.collective_recvs()]
    counts = [s.count for s in ex.collective_recvs()]
    if offsets != [sum(counts[:i]) for i in range(len(counts))]:
        # Only reachable with a group whose rank order differs from the row order; keep it correct.
        result = torch.empty_like(out)
        cursor = 0
        for off, n in zip(offsets, counts):
            result[off : off + n] = out[cursor : cursor + n]
            cursor += n
        return result
    return out


# ----------------------------------------------------------------------------------------- experts


@dataclass
class ReceivedExperts:
    """Per-expert blocks a rollout rank ends with, in training orientation (views, no copies)."""

    kind: ExpertWeight
    dims: ExpertDims
    experts: dict[int, torch.Tensor]
    buffers: list[torch.Tensor]

    @property
    def buffer_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


def _check_group_holds_plan(plan: ExpertReshardPlan, rank: int, group: dist.ProcessGroup | None) -> None:
    """Refuse a group that some transfer of *any* member leaves, so all members refuse together
    (a member whose own peers are all inside would otherwise wait in the collective forever)."""
    ranks = group_ranks(group)
    if len(ranks) == plan.training.world_size:
        return
    members = set(ranks)
    for m in ranks:
        for rnd in range(plan.num_rounds):
            ex = plan.rank_exchange(m, rnd)
            for s in ex.sends + ex.recvs:
                if s.peer not in members:
                    raise PlanMismatchError(
                        f"rank {rank}: plan peer {s.peer} of group member {m} is not in the process group "
                        f"{ranks}; pass a group that contains every peer (e.g. the world)"
                    )


def collect_experts(
    ex: RankExchange, need: range, received: torch.Tensor, units: torch.Tensor, into: dict[int, torch.Tensor]
) -> None:
    """Index one round's receive buffer (and the rank's own kept experts) by global expert id."""
    cursor = 0
    for s in ex.collective_recvs():
        for i in range(s.count):
            into[need.start + s.offset + i] = received[cursor + i]
        cursor += s.count
    if ex.has_self and not ex.self_in_collective:
        own_send, own_recv = ex.own_slots()
        for i in range(ex.self_count):
            into[need.start + own_recv.offset + i] = units[own_send.offset + i]


def reshard_expert_weight(
    plan: ExpertReshardPlan,
    rank: int,
    kind: ExpertWeight,
    dims: ExpertDims,
    weight: torch.Tensor | None,
    dtype: torch.dtype | None = None,
    group: dist.ProcessGroup | None = None,
    recorder: Recorder | None = None,
) -> ReceivedExperts:
    """Move one grouped-GEMM expert weight of one MoE layer into the rollout's expert ownership.

    ``weight`` is this rank's Megatron parameter (``None`` on a rank that does not hold the layer, then
    ``dtype`` is required). Every rank of the group must call this for every layer, holder or not.
    """
    kind = ExpertWeight(kind)
    held, need = plan.held(rank), plan.needed(rank)
    shape = dims.expert_shape(kind)
    if len(held):
        expect = dims.training_param_shape(kind, len(held))
        if weight is None or tuple(weight.shape) != expect:
            got = None if weight is None else tuple(weight.shape)
            raise PlanMismatchError(
                f"rank {rank}: {kind.value} has shape {got}, the plan expects {expect} ({len(held)} local experts)"
            )
        units = weight.view(len(held), *shape)
    else:
        if dtype is None:
            if weight is None:
                raise PlanMismatchError(f"rank {rank} holds no expert of this layer: pass dtype")
            dtype = weight.dtype
        units = torch.empty((0, *shape), dtype=dtype, device=weight.device if weight is not None else "cpu")
    _check_group_holds_plan(plan, rank, group)
    experts: dict[int, torch.Tensor] = {}
    buffers = []
    for rnd in range(plan.num_rounds):
        ex = plan.rank_exchange(rank, rnd)
        out = exchange_units(ex, units, group, recorder)
        if out.numel():
            buffers.append(out)
        collect_experts(ex, need, out, units, experts)
    if sorted(experts) != list(need):
        raise PlanMismatchError(f"rank {rank}: received experts {sorted(experts)}, needs {list(need)}")
    return ReceivedExperts(kind, dims, experts, buffers)


# ----------------------------------------------------------------------------------------- pipeline


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def gather_pipeline_params(
    plan: PpGatherPlan,
    stage: int,
    tensors: Mapping[str, torch.Tensor],
    group: dist.ProcessGroup | None,
    rank: int | None = None,
    recorder: Recorder | None = None,
    buckets: Sequence[int] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(global_name, tensor)`` of every eligible parameter of every stage, bucket by bucket.

    ``group`` is the pipeline group (group rank == stage); ``tensors`` maps this stage's local names to
    its (TP-gathered) tensors. Tensors yielded for a bucket are views into that bucket's receive buffer.
    ``buckets`` (indices into ``plan.buckets``) restricts the call to those buckets, so a caller can build
    each bucket's TP-gathered tensors just before its exchange instead of holding the whole stage; then
    ``tensors`` needs only those buckets' parameters.
    """
    names = plan.eligible[stage]
    chosen = range(len(plan.buckets)) if buckets is None else list(buckets)
    wanted = [i for b in chosen for i in range(*plan.buckets[b])]
    for i in wanted:
        name = names[i]
        t = tensors.get(name)
        if t is None:
            raise PlanMismatchError(f"stage {stage}: eligible parameter {name!r} was not passed")
        if tuple(t.shape) != plan.shapes[i] or dtype_bytes(str(t.dtype)) != dtype_bytes(plan.dtypes[i]):
            raise PlanMismatchError(
                f"stage {stage}: {name!r} is {tuple(t.shape)} {t.dtype}, the plan "
                f"expects {plan.shapes[i]} {plan.dtypes[i]}"
            )
    ranks = group_ranks(group)
    if len(ranks) != plan.pp:
        raise PlanMismatchError(f"pipeline group {ranks} has {len(ranks)} ranks for {plan.pp} stages")
    me = ranks[stage] if rank is None else rank
    global_names = [plan.global_names(s) for s in range(plan.pp)]
    for start, stop in (plan.buckets[b] for b in chosen):
        parts = [tensors[names[i]].reshape(-1) for i in range(start, stop)]
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        n = flat.numel()
        out = flat.new_empty(plan.pp * n)
        if recorder is not None:
            per_peer = tuple(n * flat.element_size() for _ in ranks)
            recorder(CollectiveRecord("all_gather", me, tuple(ranks), per_peer, per_peer))
        _all_gather_flat(out, flat.contiguous(), group)
        for s in range(plan.pp):
            cursor = s * n
            for i in range(start, stop):
                size = plan.numel(i)
                yield global_names[s][i], out[cursor : cursor + size].view(plan.shapes[i])
                cursor += size
