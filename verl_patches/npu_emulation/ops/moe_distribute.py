"""MC2 token dispatch and combine: torch_npu.npu_moe_distribute_dispatch / npu_moe_distribute_combine, the
expert-parallel all-to-all of vllm-ascend's A3 decode path, over gloo with ``all_to_all_single``.

The EP group is the process group registered under the HCCL communicator name `group_ep`
(`verl_patches.npu_emulation.hccl_names`); every rank of it calls dispatch, then combine, in the same order.
Collectives move CPU tensors (what gloo carries); outputs come back on x's device.

Dispatch: rank r sends each (token t, choice k) to the rank owning expert e = expert_ids[t, k] (rank e // L,
L = moe_expert_num / ep_world_size local experts). A rank's ``expand_x`` holds what it received grouped by
local expert, and within an expert by source rank, each source's rows in its (t, k) order; the rows after
them, up to the kernel's fixed bound A = global_bs * min(L, K) (global_bs 0 means BS * ep_world_size), are
zeros. Fixed output shapes are what make the op traceable:

    expand_x (A, H) x.dtype | dynamic_scales (A,) fp32, zeros (no quantisation) | expand_idx (BS*K,) int32 |
    expert_token_nums (L,) int64 | ep_recv_counts (ep_world_size*L,) int32 | tp_recv_counts (tp_world_size,) int32,
    zeros | expand_scales (A,) fp32, zeros

with expert_token_nums the rows per local expert (cumulative when expert_token_nums_type is 0). The kernel
documents expand_idx and ep_recv_counts as opaque, to be handed to combine only; here expand_idx[t*K + k] is how
many earlier tokens of this rank chose the same expert, and ep_recv_counts the cumulative row counts in
(local expert, source rank) order.

Combine is the way back: each expert row returns to its source rank, and token t gets
sum_k expert_scales[t, k] * row(t, k), summed in fp32, in expand_x's dtype.

Not emulated (NotImplementedError): quantisation (quant_mode != 0, scales), shared-expert ranks
(shared_expert_rank_num != 0), a TP group (tp_world_size > 1), expert_scales / expand_scales (A2 only).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl_patches.npu_emulation.hccl_names import group_named
from verl_patches.npu_emulation.ops.moe_routing import blocks_in_other_order

DISPATCH = "npu_moe_distribute_dispatch"
COMBINE = "npu_moe_distribute_combine"
IDX = torch.int32


@dataclass(frozen=True)
class DispatchLayout:
    tokens: int  # BS
    top_k: int  # K
    local_experts: int  # L
    rows: int  # A: the expand_x rows the kernel reserves
    tp_world_size: int

    @property
    def expand_rows(self) -> int:
        return self.rows * max(self.tp_world_size, 1)


def dispatch_layout(
    op: str,
    expert_ids: torch.Tensor,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    *,
    tp_world_size: int,
    expert_shard_type: int,
    shared_expert_rank_num: int,
    quant_mode: int,
    global_bs: int,
) -> DispatchLayout:
    """Checks the arguments that fix the shapes (no tensor values read); returns the sizes."""
    if expert_ids.dim() != 2:
        raise ValueError(f"{op}: expert_ids must be 2-D (BS, K), got shape {tuple(expert_ids.shape)}")
    if expert_ids.dtype != IDX:
        raise TypeError(f"{op}: expert_ids must be int32, got {expert_ids.dtype}")
    if ep_world_size < 1 or not 0 <= ep_rank_id < ep_world_size:
        raise ValueError(f"{op}: ep_rank_id={ep_rank_id} is not a rank of ep_world_size={ep_world_size}")
    if shared_expert_rank_num != 0 or expert_shard_type != 0:
        raise NotImplementedError(
            f"{op}: shared-expert ranks (shared_expert_rank_num={shared_expert_rank_num}, "
            f"expert_shard_type={expert_shard_type}) are not emulated; vllm-ascend passes 0, 0"
        )
    if quant_mode != 0:
        raise NotImplementedError(f"{op}: quant_mode={quant_mode} (int8 dispatch) is not emulated")
    if tp_world_size not in (0, 1):
        raise NotImplementedError(f"{op}: tp_world_size={tp_world_size}: the kernel has no TP group (0 or 1 only)")
    if moe_expert_num < 1 or moe_expert_num % ep_world_size:
        raise ValueError(
            f"{op}: moe_expert_num={moe_expert_num} must be a positive multiple of ep_world_size={ep_world_size}"
        )
    tokens, top_k = expert_ids.shape
    if top_k > moe_expert_num:
        raise ValueError(f"{op}: K={top_k} choices per token exceed moe_expert_num={moe_expert_num}")
    total_bs = global_bs if global_bs else tokens * ep_world_size
    if global_bs < 0 or tokens * ep_world_size > total_bs:
        raise ValueError(
            f"{op}: global_bs={global_bs} must be 0 or at least BS x ep_world_size = {tokens} x {ep_world_size} "
            "(the largest batch of any rank, times the ranks)"
        )
    local = moe_expert_num // ep_world_size
    return DispatchLayout(tokens, top_k, local, total_bs * min(local, top_k), tp_world_size)


def _ep_group(op: str, group_ep: str | None, ep_world_size: int, ep_rank_id: int) -> dist.ProcessGroup:
    group = group_named(group_ep, op)
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    if size != ep_world_size or rank != ep_rank_id:
        raise ValueError(
            f"{op}: the group {group_ep!r} has {size} ranks and this process is its rank {rank}, "
            f"but ep_world_size={ep_world_size}, ep_rank_id={ep_rank_id}"
        )
    return group


def _check_choices(op: str, flat: torch.Tensor, top_k: int, moe_expert_num: int) -> None:
    if flat.numel() == 0:
        return
    if int(flat.min()) < 0 or int(flat.max()) >= moe_expert_num:
        raise ValueError(f"{op}: expert_ids must be in [0, moe_expert_num={moe_expert_num})")
    rows = torch.sort(flat.view(-1, top_k), dim=1).values
    if bool((rows[:, 1:] == rows[:, :-1]).any()):
        raise ValueError(f"{op}: a token chose one expert twice (each row of expert_ids must be distinct)")


def _exchange(
    send: torch.Tensor, send_splits: list[int], recv_splits: list[int], group: dist.ProcessGroup
) -> torch.Tensor:
    out = send.new_empty(sum(recv_splits), *send.shape[1:])
    dist.all_to_all_single(out, send.contiguous(), recv_splits, send_splits, group=group)
    return out


def _choices_per_expert(flat: torch.Tensor, moe_expert_num: int, ep_world_size: int) -> torch.Tensor:
    """[ep_world_size, L]: how many of this rank's (t, k) choices go to each expert, by owning rank."""
    return torch.bincount(flat, minlength=moe_expert_num).view(ep_world_size, -1)


def npu_moe_distribute_dispatch(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    group_ep: str | None,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    *,
    scales: torch.Tensor | None = None,
    x_active_mask: torch.Tensor | None = None,
    expert_scales: torch.Tensor | None = None,
    group_tp: str | None = None,
    tp_world_size: int = 0,
    tp_rank_id: int = 0,
    expert_shard_type: int = 0,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    quant_mode: int = 0,
    global_bs: int = 0,
    expert_token_nums_type: int = 1,
) -> tuple[torch.Tensor, ...]:
    """See the module docstring. x_active_mask is reserved in the kernel and ignored here too."""
    layout = _check_dispatch(x, expert_ids, scales, expert_scales, ep_world_size, ep_rank_id, moe_expert_num, locals())
    group = _ep_group(DISPATCH, group_ep, ep_world_size, ep_rank_id)
    flat = expert_ids.reshape(-1).long().cpu()
    _check_choices(DISPATCH, flat, layout.top_k, moe_expert_num)
    per_expert = _choices_per_expert(flat, moe_expert_num, ep_world_size)
    # counts first: row [src, le] of `received_counts` is how many rows source rank src sends to local expert le
    received_counts = _exchange(per_expert, [1] * ep_world_size, [1] * ep_world_size, group)
    received = int(received_counts.sum())
    if received > layout.rows:
        raise ValueError(
            f"{DISPATCH}: rank {ep_rank_id} is sent {received} rows, more than the kernel's bound "
            f"A = global_bs x min(local experts, K) = {layout.rows}: global_bs={global_bs} is too small"
        )
    order = torch.argsort(flat, stable=True)  # by expert: by destination rank, then local expert, then (t, k)
    rows = _exchange(
        x.cpu().index_select(0, order // layout.top_k),
        per_expert.sum(dim=1).tolist(),
        received_counts.sum(dim=1).tolist(),
        group,
    )
    expand_x = x.new_zeros(layout.expand_rows, x.shape[1], device="cpu")
    expand_x[:received] = rows.index_select(0, blocks_in_other_order(received_counts.tolist(), rows.device))
    by_expert_then_source = received_counts.t().reshape(-1)
    per_local_expert = received_counts.sum(dim=0)
    if expert_token_nums_type == 0:
        per_local_expert = per_local_expert.cumsum(dim=0)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    first_of_expert = per_expert.reshape(-1).cumsum(dim=0) - per_expert.reshape(-1)
    device = x.device
    return (
        expand_x.to(device),
        torch.zeros(layout.expand_rows, dtype=torch.float32, device=device),
        (position - first_of_expert[flat]).to(IDX).to(device),
        per_local_expert.to(torch.int64).to(device),
        by_expert_then_source.cumsum(dim=0).to(IDX).to(device),
        torch.zeros(tp_world_size, dtype=IDX, device=device),
        torch.zeros(layout.rows, dtype=torch.float32, device=device),
    )


def _check_dispatch(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    scales: torch.Tensor | None,
    expert_scales: torch.Tensor | None,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    kwargs: dict,
) -> DispatchLayout:
    if x.dim() != 2:
        raise ValueError(f"{DISPATCH}: x must be 2-D (BS, H), got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{DISPATCH}: x must be floating point, got {x.dtype}")
    if expert_ids.dim() == 2 and expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"{DISPATCH}: expert_ids has {expert_ids.shape[0]} rows, x has {x.shape[0]}")
    if scales is not None:
        raise NotImplementedError(f"{DISPATCH}: scales (quantised dispatch) are not emulated")
    if expert_scales is not None:
        raise NotImplementedError(f"{DISPATCH}: expert_scales (the A2 layered algorithm) are not emulated")
    if kwargs["expert_token_nums_type"] not in (0, 1):
        raise ValueError(f"{DISPATCH}: expert_token_nums_type must be 0 (cumsum) or 1 (counts)")
    return dispatch_layout(
        DISPATCH,
        expert_ids,
        ep_world_size,
        ep_rank_id,
        moe_expert_num,
        tp_world_size=kwargs["tp_world_size"],
        expert_shard_type=kwargs["expert_shard_type"],
        shared_expert_rank_num=kwargs["shared_expert_rank_num"],
        quant_mode=kwargs["quant_mode"],
        global_bs=kwargs["global_bs"],
    )


def dispatch_shapes(
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    group_ep: str | None,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    *,
    scales: torch.Tensor | None = None,
    x_active_mask: torch.Tensor | None = None,
    expert_scales: torch.Tensor | None = None,
    group_tp: str | None = None,
    tp_world_size: int = 0,
    tp_rank_id: int = 0,
    expert_shard_type: int = 0,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    quant_mode: int = 0,
    global_bs: int = 0,
    expert_token_nums_type: int = 1,
) -> tuple[torch.Tensor, ...]:
    """The dispatch outputs' shapes and dtypes, from the arguments alone (the fake implementation)."""
    layout = _check_dispatch(x, expert_ids, scales, expert_scales, ep_world_size, ep_rank_id, moe_expert_num, locals())
    group_named(group_ep, DISPATCH)  # an unknown name fails at trace time, not at the first run
    return (
        x.new_empty(layout.expand_rows, x.shape[1]),
        x.new_empty(layout.expand_rows, dtype=torch.float32),
        x.new_empty(layout.tokens * layout.top_k, dtype=IDX),
        x.new_empty(layout.local_experts, dtype=torch.int64),
        x.new_empty(ep_world_size * layout.local_experts, dtype=IDX),
        x.new_empty(tp_world_size, dtype=IDX),
        x.new_empty(layout.rows, dtype=torch.float32),
    )


def _check_combine(
    expand_x: torch.Tensor,
    expert_ids: torch.Tensor,
    expand_idx: torch.Tensor,
    ep_send_counts: torch.Tensor,
    expert_scales: torch.Tensor,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    kwargs: dict,
) -> DispatchLayout:
    op = COMBINE
    for name in ("activation_scale", "weight_scale", "group_list", "expand_scales", "shared_expert_x"):
        if kwargs[name] is not None:
            raise NotImplementedError(f"{op}: {name} is not emulated (reserved, A2-only or shared-expert input)")
    if kwargs["comm_quant_mode"] != 0:
        raise NotImplementedError(f"{op}: comm_quant_mode={kwargs['comm_quant_mode']} (int8 transfer) is not emulated")
    if expand_x.dim() != 2:
        raise ValueError(f"{op}: expand_x must be 2-D (A, H), got shape {tuple(expand_x.shape)}")
    layout = dispatch_layout(
        op,
        expert_ids,
        ep_world_size,
        ep_rank_id,
        moe_expert_num,
        tp_world_size=kwargs["tp_world_size"],
        expert_shard_type=kwargs["expert_shard_type"],
        shared_expert_rank_num=kwargs["shared_expert_rank_num"],
        quant_mode=0,
        global_bs=kwargs["global_bs"],
    )
    slots = layout.tokens * layout.top_k
    if tuple(expand_idx.shape) != (slots,) or expand_idx.dtype != IDX:
        raise ValueError(
            f"{op}: expand_idx must be dispatch's, int32 ({slots},), got {tuple(expand_idx.shape)} {expand_idx.dtype}"
        )
    sends = ep_world_size * layout.local_experts
    if tuple(ep_send_counts.shape) != (sends,) or ep_send_counts.dtype != IDX:
        raise ValueError(
            f"{op}: ep_send_counts must be dispatch's ep_recv_counts, int32 ({sends},), "
            f"got {tuple(ep_send_counts.shape)} {ep_send_counts.dtype}"
        )
    if tuple(expert_scales.shape) != tuple(expert_ids.shape):
        raise ValueError(
            f"{op}: expert_scales shape {tuple(expert_scales.shape)} differs from expert_ids {tuple(expert_ids.shape)}"
        )
    return layout


def npu_moe_distribute_combine(
    expand_x: torch.Tensor,
    expert_ids: torch.Tensor,
    expand_idx: torch.Tensor,
    ep_send_counts: torch.Tensor,
    expert_scales: torch.Tensor,
    group_ep: str | None,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    *,
    tp_send_counts: torch.Tensor | None = None,
    x_active_mask: torch.Tensor | None = None,
    activation_scale: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    group_list: torch.Tensor | None = None,
    expand_scales: torch.Tensor | None = None,
    shared_expert_x: torch.Tensor | None = None,
    group_tp: str | None = None,
    tp_world_size: int = 0,
    tp_rank_id: int = 0,
    expert_shard_type: int = 0,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    global_bs: int = 0,
    out_dtype: int = 0,
    comm_quant_mode: int = 0,
    group_list_type: int = 0,
) -> torch.Tensor:
    """See the module docstring: the expert rows of `expand_x` back to their tokens, weighted by expert_scales."""
    layout = _check_combine(
        expand_x,
        expert_ids,
        expand_idx,
        ep_send_counts,
        expert_scales,
        ep_world_size,
        ep_rank_id,
        moe_expert_num,
        locals(),
    )
    group = _ep_group(COMBINE, group_ep, ep_world_size, ep_rank_id)
    ends = ep_send_counts.long().cpu()
    held = torch.diff(ends, prepend=ends.new_zeros(1))
    if held.numel() and (int(held.min()) < 0 or int(ends[-1]) > expand_x.shape[0]):
        raise ValueError(f"{COMBINE}: ep_send_counts {ends.tolist()} are not dispatch's cumulative counts for expand_x")
    by_expert_then_source = held.view(layout.local_experts, ep_world_size)
    local_rows = expand_x.cpu()[: int(ends[-1]) if ends.numel() else 0]
    flat = expert_ids.reshape(-1).long().cpu()
    _check_choices(COMBINE, flat, layout.top_k, moe_expert_num)
    per_expert = _choices_per_expert(flat, moe_expert_num, ep_world_size)
    back = _exchange(
        local_rows.index_select(0, blocks_in_other_order(by_expert_then_source.tolist(), local_rows.device)),
        by_expert_then_source.sum(dim=0).tolist(),
        per_expert.sum(dim=1).tolist(),
        group,
    )
    # `back` is in this rank's dispatch order (by expert, then (t, k)): slot (t, k) sits at its expert's first
    # row plus expand_idx[t*K + k]
    first_of_expert = per_expert.reshape(-1).cumsum(dim=0) - per_expert.reshape(-1)
    where = first_of_expert[flat] + expand_idx.long().cpu()
    picked = back.float().index_select(0, where).view(layout.tokens, layout.top_k, -1)
    out = (picked * expert_scales.float().cpu().unsqueeze(-1)).sum(dim=1)
    return out.to(expand_x.dtype).to(expand_x.device)


def combine_shapes(
    expand_x: torch.Tensor,
    expert_ids: torch.Tensor,
    expand_idx: torch.Tensor,
    ep_send_counts: torch.Tensor,
    expert_scales: torch.Tensor,
    group_ep: str | None,
    ep_world_size: int,
    ep_rank_id: int,
    moe_expert_num: int,
    *,
    tp_send_counts: torch.Tensor | None = None,
    x_active_mask: torch.Tensor | None = None,
    activation_scale: torch.Tensor | None = None,
    weight_scale: torch.Tensor | None = None,
    group_list: torch.Tensor | None = None,
    expand_scales: torch.Tensor | None = None,
    shared_expert_x: torch.Tensor | None = None,
    group_tp: str | None = None,
    tp_world_size: int = 0,
    tp_rank_id: int = 0,
    expert_shard_type: int = 0,
    shared_expert_num: int = 1,
    shared_expert_rank_num: int = 0,
    global_bs: int = 0,
    out_dtype: int = 0,
    comm_quant_mode: int = 0,
    group_list_type: int = 0,
) -> torch.Tensor:
    """The combine output's shape and dtype (BS, H), from the arguments alone (the fake implementation)."""
    layout = _check_combine(
        expand_x,
        expert_ids,
        expand_idx,
        ep_send_counts,
        expert_scales,
        ep_world_size,
        ep_rank_id,
        moe_expert_num,
        locals(),
    )
    group_named(group_ep, COMBINE)
    return expand_x.new_empty(layout.tokens, expand_x.shape[1])
