"""Execute a `SyncPlan` on one rank: this rank's Megatron shards in, ``(hf_name, tensor)`` for vLLM out.

The generator is streamed: each step (one lockstep bucket, one legacy parameter, one expert weight of one
layer) allocates its buffers, yields its tensors, and drops everything before the next step, so the
rollout's ``load_weights`` (which copies) never sees more than one step alive. Every rank must drain the
generator completely and in lockstep (each step is a collective).

What a rank yields: every non-expert HF tensor of the whole model, whole (vLLM's loaders narrow to the
rollout's TP shard themselves), and the routed experts *this rollout rank serves*, nothing else: a
non-local expert is never received, built, or named (vLLM's expert-parallel loader would skip it anyway).
The router's score-correction bias (``mlp.router.expert_bias``, a state-dict entry, not a parameter in
Megatron) is part of the table like any other replicated tensor.

`SyncMeter` measures what the real run did: bytes per collective as handed to the collective, and the
largest number of bytes the sync held at once in buffers it allocated itself (receive buffers, TP merges,
staging), counted by storage so views are free and the training shards never count.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from verl_patches.reshard.ep_plan import ExpertWeight
from verl_patches.reshard.errors import PlanMismatchError
from verl_patches.reshard.executors import CollectiveRecord, gather_pipeline_params, group_ranks, reshard_expert_weight
from verl_patches.reshard.rollout_experts import expert_param_name, rollout_expert_tensors
from verl_patches.resilience import progress
from verl_patches.sync.convert import merge_tp, to_hf
from verl_patches.sync.param_table import SyncParam
from verl_patches.sync.plan import SyncPath, SyncPlan

Named = list[tuple[str, torch.Tensor]]
KINDS = (ExpertWeight.WEIGHT1, ExpertWeight.WEIGHT2)


@dataclass(frozen=True)
class SyncGroups:
    """This rank's training process groups (``None`` means the world group, only valid at size 1 or world)."""

    tp: dist.ProcessGroup | None
    pp: dist.ProcessGroup | None
    tp_ep: dist.ProcessGroup | None  # used by the all-gather path only


@dataclass
class SyncMeter:
    records: list[CollectiveRecord] = field(default_factory=list)
    peak_extra: int = 0
    steps: int = 0

    def record(self, rec: CollectiveRecord) -> None:
        self.records.append(rec)

    @property
    def sent(self) -> int:
        return sum(r.bytes_sent_to_peers for r in self.records)

    @property
    def received(self) -> int:
        return sum(r.bytes_received_from_peers for r in self.records)

    @property
    def calls(self) -> int:
        return len(self.records)

    def step(self, tensors: Iterable[torch.Tensor], held: set[int], extra: int = 0) -> None:
        """Account one step's live buffers: distinct storages not among the training shards (``held``),
        plus ``extra`` bytes a callee allocated internally."""
        seen: dict[int, int] = {}
        for t in tensors:
            st = t.untyped_storage()
            ptr = st.data_ptr()
            if ptr not in held and st.nbytes():
                seen[ptr] = st.nbytes()
        self.steps += 1
        self.peak_extra = max(self.peak_extra, sum(seen.values()) + extra)


def _check_local(plan: SyncPlan, stage: int, local: Mapping[str, torch.Tensor]) -> None:
    """Refuse a state dict that does not match the plan before the first collective."""
    for p in plan.stages[stage]:
        t = local.get(p.local_name)
        if t is None:
            raise PlanMismatchError(f"stage {stage}: parameter {p.local_name!r} is missing from the model")
        if tuple(t.shape) != p.local_shape:
            raise PlanMismatchError(
                f"stage {stage}: {p.local_name!r} has shape {tuple(t.shape)}, the plan expects {p.local_shape}"
            )
        if t.dtype != p.dtype:
            raise PlanMismatchError(f"stage {stage}: {p.local_name!r} is {t.dtype}, the plan expects {p.dtype}")


def _record(meter: SyncMeter | None, op: str, rank: int, ranks: list[int], send: list[int], recv: list[int]) -> None:
    if meter is not None:
        meter.record(CollectiveRecord(op, rank, tuple(ranks), tuple(send), tuple(recv)))


def _tp_merge(
    p: SyncParam, shard: torch.Tensor, group: dist.ProcessGroup | None, rank: int, meter: SyncMeter | None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The TP-merged tensor and the buffers allocated for it."""
    ranks = group_ranks(group)
    if not p.is_tp_split or len(ranks) == 1:
        return shard, []
    shard = shard.contiguous()
    n = shard.numel() * shard.element_size()
    if p.kind == "gate_up":
        for _ in range(2):
            _record(meter, "all_gather", rank, ranks, [n // 2] * len(ranks), [n // 2] * len(ranks))
    else:
        _record(meter, "all_gather", rank, ranks, [n] * len(ranks), [n] * len(ranks))
    if p.kind == "tp_rows":  # row shards tile the merged tensor: gather straight into it, no merge copy
        full = shard.new_empty(p.full_shape)
        dist.all_gather_into_tensor(full, shard, group=group)
        return full, [full]
    if p.kind == "gate_up":  # [gate_t; up_t]: gather the gate halves, then the up halves, into their places
        full = shard.new_empty(p.full_shape)
        half, rows = full.shape[0] // 2, shard.shape[0] // 2
        dist.all_gather_into_tensor(full.narrow(0, 0, half), shard.narrow(0, 0, rows), group=group)
        dist.all_gather_into_tensor(full.narrow(0, half, half), shard.narrow(0, rows, rows), group=group)
        return full, [full]
    parts = [torch.empty_like(shard) for _ in ranks]
    dist.all_gather(parts, shard, group=group)
    parts[ranks.index(rank)] = shard  # our own slot stays a view of the training shard
    full = merge_tp(p.kind, parts)
    return full, parts + [full]


def _owned(tensor: torch.Tensor | None, rank: int, owner_stage: int) -> torch.Tensor:
    """``tensor``, which this rank must have: it is on the owning stage, or received it from there."""
    if tensor is None:
        raise PlanMismatchError(f"rank {rank}: no tensor of owning stage {owner_stage} (neither its own nor received)")
    return tensor


def _broadcast(
    p_shape: tuple[int, ...],
    dtype: torch.dtype,
    tensor: torch.Tensor | None,
    owner_stage: int,
    group: dist.ProcessGroup | None,
    rank: int,
    meter: SyncMeter | None,
) -> torch.Tensor:
    """The owning stage's tensor on every stage of the pipeline group (a new buffer off the owner)."""
    ranks = group_ranks(group)
    if len(ranks) == 1:
        return _owned(tensor, rank, owner_stage)
    src = ranks[owner_stage]
    n = torch.Size(p_shape).numel() * dtype.itemsize
    if rank == src:
        tensor = _owned(tensor, rank, owner_stage)
        _record(meter, "broadcast", rank, ranks, [n] * len(ranks), [0] * len(ranks))
        dist.broadcast(tensor.contiguous(), src=src, group=group)
        return tensor
    buf = torch.empty(p_shape, dtype=dtype)
    _record(meter, "broadcast", rank, ranks, [0] * len(ranks), [n if g == src else 0 for g in ranks])
    dist.broadcast(buf, src=src, group=group)
    return buf


def _row_pieces(plan: SyncPlan, p: SyncParam) -> list[tuple[str, int, int]]:
    """``(hf_name, first_row, rows)`` of each HF tensor inside one rank's shard (rows of the local shard)."""
    rows = p.local_shape[0]
    if p.kind == "gate_up":  # [gate_t; up_t]: each half TP-merges by rows into one HF tensor
        return [(p.hf_names[0], 0, rows // 2), (p.hf_names[1], rows // 2, rows // 2)]
    if p.kind == "concat_rows":  # replicated [q_a; kv_a]
        q = int(plan.cfg["q_lora_rank"])
        return [(p.hf_names[0], 0, q), (p.hf_names[1], q, rows - q)]
    return [(p.hf_names[0], 0, rows)]


def _piece_steps(
    plan: SyncPlan,
    p: SyncParam,
    stage: int,
    rank: int,
    local: Mapping[str, torch.Tensor],
    groups: SyncGroups,
    meter: SyncMeter | None,
) -> Iterator[tuple[Named, list[torch.Tensor]]]:
    """One non-expert parameter of another route's leftovers, one HF tensor per step, each allocated once.

    Every HF tensor of the parameter is assembled straight in its final buffer: the owning stage's TP
    shards are broadcast over the pipeline group *into their slot* of that buffer, then the TP group fills
    the other slots in place (``all_gather_into_tensor`` with the input being this rank's own slot, the
    in-place form NCCL and HCCL document). Column-split tensors (``linear_proj``, ``linear_fc2``) are
    assembled transposed, where the shards are rows, and handed over as a transposed view. So a rank holds
    one HF tensor at a time and receives each byte it lacks once.
    """
    tp_ranks, pp_ranks = group_ranks(groups.tp), group_ranks(groups.pp)
    tp, t = len(tp_ranks), tp_ranks.index(rank)
    owner = p.stage == stage
    shard = local[p.local_name] if owner else None
    src = pp_ranks[p.stage]
    split = p.is_tp_split and tp > 1
    cols = p.kind == "tp_cols" and split
    for hf_name, first, rows in _row_pieces(plan, p):
        # this rank's rows of the HF tensor: the owner's own, else received below (None until then)
        piece = shard.narrow(0, first, rows) if shard is not None else None
        shape: tuple[int, ...]
        if cols:
            piece = piece.t().contiguous() if piece is not None else None  # the shard as rows of the transpose
            shape = (p.local_shape[1], rows)
        else:
            shape = (rows, *p.local_shape[1:])
        n = torch.Size(shape).numel() * p.dtype.itemsize
        allocated: list[torch.Tensor] = []
        full: torch.Tensor | None = None  # set exactly when split
        slot: torch.Tensor | None = None
        if split:
            full = torch.empty((tp * shape[0], *shape[1:]), dtype=p.dtype)
            slot = full.narrow(0, t * shape[0], shape[0])
            allocated.append(full)
        if len(pp_ranks) > 1:
            if piece is not None:  # the owner
                if cols:
                    allocated.append(piece)
                send = piece.contiguous()
                _record(meter, "broadcast", rank, pp_ranks, [n] * len(pp_ranks), [0] * len(pp_ranks))
                dist.broadcast(send, src=src, group=groups.pp)
            else:
                if slot is None:
                    slot = torch.empty(shape, dtype=p.dtype)
                    allocated.append(slot)
                _record(
                    meter, "broadcast", rank, pp_ranks, [0] * len(pp_ranks), [n if g == src else 0 for g in pp_ranks]
                )
                dist.broadcast(slot, src=src, group=groups.pp)
                piece = slot
        elif cols and piece is not None:
            allocated.append(piece)
        # a rank off the owning stage only exists in a pipeline group, where it received its piece above
        piece = _owned(piece, rank, p.stage)
        if full is not None:
            _record(meter, "all_gather", rank, tp_ranks, [n] * tp, [n] * tp)
            dist.all_gather_into_tensor(full, piece, group=groups.tp)  # off the owner, piece is the slot
            tensor = full.t() if cols else full
        else:
            tensor = piece.t() if cols else piece
        yield [(hf_name, tensor)], allocated


def _legacy_step(
    plan: SyncPlan,
    p: SyncParam,
    stage: int,
    rank: int,
    local: Mapping[str, torch.Tensor],
    groups: SyncGroups,
    meter: SyncMeter | None,
) -> tuple[Named, list[torch.Tensor]]:
    shard = local[p.local_name] if p.stage == stage else None
    shard = _broadcast(p.local_shape, p.dtype, shard, p.stage, groups.pp, rank, meter)
    full, bufs = _tp_merge(p, shard, groups.tp, rank, meter)
    return to_hf(p.kind, full, p.hf_names, plan.cfg), bufs + [shard]


def _lockstep_steps(
    plan: SyncPlan,
    stage: int,
    rank: int,
    local: Mapping[str, torch.Tensor],
    groups: SyncGroups,
    meter: SyncMeter | None,
) -> Iterator[tuple[Named, list[torch.Tensor], int]]:
    pp_plan = plan.pp_plan
    if pp_plan is None:  # the all-gather path has no lockstep parameters
        return
    by_global = {p.global_name: p for params in plan.stages for p in params}
    mine = plan.lockstep_params(stage)
    for b, (start, stop) in enumerate(pp_plan.buckets):
        fulls, bufs = {}, []
        for i in range(start, stop):
            p = mine[i]
            fulls[p.local_name], allocated = _tp_merge(p, local[p.local_name], groups.tp, rank, meter)
            bufs += allocated
        recorder = meter.record if meter is not None else None
        gathered = list(gather_pipeline_params(pp_plan, stage, fulls, groups.pp, rank, recorder, buckets=[b]))
        # the executor concatenates a multi-parameter bucket into one send buffer of the bucket's size
        internal = pp_plan.bucket_bytes(b) if stop - start > 1 else 0
        out: Named = []
        for gname, t in gathered:
            p = by_global[gname]
            out += to_hf(p.kind, t, p.hf_names, plan.cfg)
        yield out, bufs + [t for _, t in gathered] + list(fulls.values()), internal


def _expert_step_a2a(
    plan: SyncPlan,
    layer: int,
    layer_stage: int,
    local_layer: int,
    kind: ExpertWeight,
    stage: int,
    rank: int,
    local: Mapping[str, torch.Tensor],
    meter: SyncMeter | None,
) -> tuple[Named, list[torch.Tensor]]:
    weight = local[f"decoder.layers.{local_layer}.mlp.experts.{kind.value}"] if stage == layer_stage else None
    recorder = meter.record if meter is not None else None
    got = reshard_expert_weight(
        plan.expert_plans[layer_stage], rank, kind, plan.dims, weight, dtype=plan.dtype, recorder=recorder
    )
    entries = rollout_expert_tensors(kind, got.experts, plan.num_experts, plan.dims.ffn)
    named = [(expert_param_name(layer, e, proj), t) for e, proj, t in entries if t.numel()]
    return named, list(got.buffers)


def _expert_step_allgather(
    plan: SyncPlan,
    layer: int,
    layer_stage: int,
    local_layer: int,
    kind: ExpertWeight,
    stage: int,
    rank: int,
    local: Mapping[str, torch.Tensor],
    groups: SyncGroups,
    meter: SyncMeter | None,
) -> tuple[Named, list[torch.Tensor]]:
    """The vendor's fallback: PP broadcast of the shard, all-gather over TP×EP, keep the served experts."""
    training = plan.training
    n_local = training.local_experts(plan.num_experts)
    shape = plan.dims.training_param_shape(kind, n_local)
    weight = local[f"decoder.layers.{local_layer}.mlp.experts.{kind.value}"] if stage == layer_stage else None
    shard = _broadcast(shape, plan.dtype, weight, layer_stage, groups.pp, rank, meter).contiguous()
    ranks = group_ranks(groups.tp_ep)
    parts = [torch.empty_like(shard) for _ in ranks]
    n = shard.numel() * shard.element_size()
    _record(meter, "all_gather", rank, ranks, [n] * len(ranks), [n] * len(ranks))
    dist.all_gather(parts, shard, group=groups.tp_ep)
    block_of = {training.expert_block(g): parts[i] for i, g in enumerate(ranks)}
    expert_shape = plan.dims.expert_shape(kind)
    need = plan.expert_plans[layer_stage].needed(rank)
    blocks = {e: block_of[e // n_local].view(n_local, *expert_shape)[e % n_local] for e in need}
    entries = rollout_expert_tensors(kind, blocks, plan.num_experts, plan.dims.ffn)
    named = [(expert_param_name(layer, e, proj), t) for e, proj, t in entries if t.numel()]
    return named, parts + ([shard] if weight is None else [])


def iter_rollout_weights(
    plan: SyncPlan, rank: int, local: Mapping[str, torch.Tensor], groups: SyncGroups, meter: SyncMeter | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Stream this rank's rollout weights (see the module docstring); a collective on every rank."""
    stage = plan.training.pp_rank(rank)
    _check_local(plan, stage, local)
    held = {t.untyped_storage().data_ptr() for t in local.values()}
    buckets = itertools.count(1)

    def emit(named: Named, bufs: list[torch.Tensor], internal: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
        if meter is not None:
            meter.step(bufs + [t for _, t in named], held, internal)
        progress.unit("bucket", next(buckets))  # hang diagnosis: one point per sync step (a collective)
        yield from named

    if plan.path is SyncPath.ALL_TO_ALL:
        for named, bufs, internal in _lockstep_steps(plan, stage, rank, local, groups, meter):
            yield from emit(named, bufs, internal)
            del named, bufs
    for p in plan.legacy:
        if plan.path is SyncPath.ALL_TO_ALL:
            for named, bufs in _piece_steps(plan, p, stage, rank, local, groups, meter):
                yield from emit(named, bufs)
                del named, bufs
        else:  # the vendor's order: PP broadcast of the shard, then TP all-gather and concatenation
            named, bufs = _legacy_step(plan, p, stage, rank, local, groups, meter)
            yield from emit(named, bufs)
            del named, bufs
    for layer, layer_stage, local_layer in plan.moe:
        for kind in KINDS:
            if plan.path is SyncPath.ALL_TO_ALL:
                named, bufs = _expert_step_a2a(plan, layer, layer_stage, local_layer, kind, stage, rank, local, meter)
            else:
                named, bufs = _expert_step_allgather(
                    plan, layer, layer_stage, local_layer, kind, stage, rank, local, groups, meter
                )
            yield from emit(named, bufs)
            del named, bufs
