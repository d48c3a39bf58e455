"""MC2 token dispatch and combine, the expert-parallel all-to-all of vllm-ascend's A3 decode path: torch_npu's
v1 pair (npu_moe_distribute_dispatch / _combine) and v2 pair (npu_moe_distribute_dispatch_v2 / _combine_v2),
over gloo with ``all_to_all_single``.

Sources. The pinned torch_npu 2.5.1.post1 wheel registers all four ops: their schemas are in its
``torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml`` and their Meta functions (the output shapes
below) in ``torch_npu/op_plugin/meta/_meta_registrations.py``. The wheel's ``_op_plugin_docs.py`` has no
entry for them; their semantics and limits come from torch_npu's API reference pages of the same names
(sections "Parameters", "Return Values" / "Outputs", "Constraints"). vllm-ascend picks v2 when
``hasattr(torch_npu, "npu_moe_distribute_dispatch_v2")`` and then passes ``x_active_mask`` and hands
``assist_info_for_combine`` (not ``expand_idx``) to the combine.

The EP group is the process group registered under the HCCL communicator name `group_ep`
(`verl_patches.npu_emulation.hccl_names`); every rank of it calls dispatch, then combine, in the same order.
Collectives move CPU tensors (what gloo carries); outputs come back on x's device.

Dispatch: rank r sends each active (token t, choice k) slot to the rank owning expert e = expert_ids[t, k]
(rank e // L, L = moe_expert_num / ep_world_size local experts). A rank's ``expand_x`` holds what it received
grouped by local expert, within an expert by source rank, each source's rows in its (t, k) order; the rows
after them, up to the kernel's fixed bound A = global_bs * min(L, K) (global_bs 0 means BS * ep_world_size),
are zeros. Outputs (fixed shapes, as the wheel's Meta functions size them, so the ops are traceable):

    expand_x (A, H) x.dtype | dynamic_scales (A,) fp32, zeros (no quantisation) |
    v1 expand_idx (BS*K,) int32  /  v2 assist_info_for_combine (max(BS*K, A*128),) int32 |
    expert_token_nums (L,) int64 | ep_recv_counts (ep_world_size*L,) int32 |
    tp_recv_counts (tp_world_size,) int32, zeros (tp_world_size 0 or 1 is "no TP domain": nothing moves there) |
    expand_scales (0,) fp32 (A3 has none: "Return Values"; the Meta function's empty tensor)

expert_token_nums: rows per local expert (cumulative when expert_token_nums_type is 0). "Constraints" makes
expand_idx / assist_info_for_combine, ep_recv_counts, tp_recv_counts and expand_scales opaque: hand them to
the combine, nothing else reads them. Here ep_recv_counts is the cumulative row count in (local expert,
source rank) order; v1's expand_idx[t*K + k] is how many earlier slots of this rank chose the same expert;
v2's assist_info_for_combine keeps, as the A3 kernel's window layout does, a triple per received row: words
3i, 3i+1, 3i+2 = (source rank, token, top-k slot) of expand_x row i, zeros after. Combine v2 returns each
row to the rank and slot its triple names; v1 recomputes the way back from expert_ids and expand_idx.

x_active_mask (v2 only; "Parameters"): a bool (BS,) mask, True entries before False ones, or a (BS, K) mask
of slots. A masked slot is not sent, counted or received anywhere; a token with no active slot combines to
zeros (its row takes part in no communication; the kernel leaves it unspecified). When ranks' BS differ,
every token must be active. v1's x_active_mask is a reserved parameter ("Parameters": keep the default):
v1 refuses a mask rather than ignore one it would not honour.

Combine: out[t] = sum over active k of expert_scales[t, k] * row(t, k), summed in fp32, in expand_x's dtype.

Errors a rank finds in its own values (expert ids, the mask, counts that do not match assist_info) are shared
through the first collective, so every rank of the group stops with an error instead of waiting in an
exchange that its peer left.

The kernels bind their arguments with `DispatchArgs` (both dispatch schemas are one), `CombineArgs` and
`CombineV2Args`: the wheel's schemas as dataclasses (a test keeps them equal to the registered ones). v1 and v2
share the checks, the exchange and the receive layout; they differ in dispatch's third output and combine's way
back.

Refused (NotImplementedError: vllm-ascend's unquantized A3 decode passes none of them): quantisation
(quant_mode != 0, scales, comm_quant_mode), shared-expert ranks (shared_expert_rank_num != 0), a TP domain
(tp_world_size 2), expert_scales / expand_scales (A2's layered algorithm; A3 supports neither), v2's
shared_expert_x, v1's activation_scale / weight_scale / group_list.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass
from typing import Any

import torch
import torch.distributed as dist

from verl_patches.npu_emulation.hccl_names import group_named
from verl_patches.npu_emulation.ops.moe_routing import blocks_in_other_order

DISPATCH = "npu_moe_distribute_dispatch"
COMBINE = "npu_moe_distribute_combine"
DISPATCH_V2 = "npu_moe_distribute_dispatch_v2"
COMBINE_V2 = "npu_moe_distribute_combine_v2"
IDX = torch.int32
ASSIST_WORDS_PER_ROW = 128  # the wheel's Meta: assist_info_for_combine has max(BS*K, A*128) words
TRIPLE = 3  # (source rank, token, top-k slot) per received row, in assist_info_for_combine


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

    @property
    def assist_words(self) -> int:
        return max(self.tokens * self.top_k, self.rows * ASSIST_WORDS_PER_ROW)


@dataclass(frozen=True, eq=False, kw_only=True)
class _MC2Options:
    """The keyword-only arguments all four MC2 schemas take, with their defaults."""

    x_active_mask: torch.Tensor | None = None
    group_tp: str = ""
    tp_world_size: int = 0
    tp_rank_id: int = 0
    expert_shard_type: int = 0
    shared_expert_num: int = 1
    shared_expert_rank_num: int = 0
    global_bs: int = 0


@dataclass(frozen=True, eq=False)
class DispatchArgs(_MC2Options):
    """A call of npu_moe_distribute_dispatch or _v2, bound as the wheel's schema binds it (the wheel registers one
    schema under the two names): six positional-or-keyword arguments, then keyword-only ones with its defaults."""

    x: torch.Tensor
    expert_ids: torch.Tensor
    group_ep: str
    ep_world_size: int
    ep_rank_id: int
    moe_expert_num: int
    _: KW_ONLY
    scales: torch.Tensor | None = None
    expert_scales: torch.Tensor | None = None
    quant_mode: int = 0
    expert_token_nums_type: int = 1


@dataclass(frozen=True, eq=False, kw_only=True)
class _CombineOptions(_MC2Options):
    """The keyword-only arguments both combine schemas add."""

    tp_send_counts: torch.Tensor | None = None
    expand_scales: torch.Tensor | None = None
    shared_expert_x: torch.Tensor | None = None
    comm_quant_mode: int = 0


@dataclass(frozen=True, eq=False)
class CombineArgs(_CombineOptions):
    """A call of npu_moe_distribute_combine (v1), bound as the wheel's schema binds it: nine positional-or-keyword
    arguments, then the keyword-only ones (v1 adds the quantised and A2-only inputs to the common ones)."""

    expand_x: torch.Tensor
    expert_ids: torch.Tensor
    expand_idx: torch.Tensor
    ep_send_counts: torch.Tensor
    expert_scales: torch.Tensor
    group_ep: str
    ep_world_size: int
    ep_rank_id: int
    moe_expert_num: int
    _: KW_ONLY
    activation_scale: torch.Tensor | None = None
    weight_scale: torch.Tensor | None = None
    group_list: torch.Tensor | None = None
    out_dtype: int = 0
    group_list_type: int = 0


@dataclass(frozen=True, eq=False)
class CombineV2Args(_CombineOptions):
    """A call of npu_moe_distribute_combine_v2, bound as the wheel's schema binds it: v1's positional arguments
    with assist_info_for_combine third, then the keyword-only ones both versions take."""

    expand_x: torch.Tensor
    expert_ids: torch.Tensor
    assist_info_for_combine: torch.Tensor
    ep_send_counts: torch.Tensor
    expert_scales: torch.Tensor
    group_ep: str
    ep_world_size: int
    ep_rank_id: int
    moe_expert_num: int


def dispatch_layout(op: str, call: DispatchArgs | CombineArgs | CombineV2Args, quant_mode: int) -> DispatchLayout:
    """Checks the arguments that fix the shapes, those both halves of the pair take (no tensor values read);
    returns the sizes."""
    expert_ids, ep_world_size, ep_rank_id = call.expert_ids, call.ep_world_size, call.ep_rank_id
    moe_expert_num, tp_world_size, global_bs = call.moe_expert_num, call.tp_world_size, call.global_bs
    if expert_ids.dim() != 2:
        raise ValueError(f"{op}: expert_ids must be 2-D (BS, K), got shape {tuple(expert_ids.shape)}")
    if expert_ids.dtype != IDX:
        raise TypeError(f"{op}: expert_ids must be int32, got {expert_ids.dtype}")
    if ep_world_size < 1 or not 0 <= ep_rank_id < ep_world_size:
        raise ValueError(f"{op}: ep_rank_id={ep_rank_id} is not a rank of ep_world_size={ep_world_size}")
    _check_shared_experts(
        op, ep_world_size, call.expert_shard_type, call.shared_expert_num, call.shared_expert_rank_num
    )
    if quant_mode != 0:
        raise NotImplementedError(f"{op}: quant_mode={quant_mode} (int8 dispatch) is not emulated")
    if tp_world_size not in (0, 1):
        raise NotImplementedError(
            f"{op}: tp_world_size={tp_world_size}: a TP domain is not emulated (0 or 1: no TP domain; "
            "vllm-ascend passes 1)"
        )
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


def _check_shared_experts(
    op: str, ep_world_size: int, expert_shard_type: int, shared_expert_num: int, shared_expert_rank_num: int
) -> None:
    """The shared-expert arguments: the rules the wheel's v2 Meta function checks, v1's "only 1 shared expert" on
    A3 ("Parameters"), then our refusal of shared-expert ranks."""
    if not 0 <= shared_expert_rank_num < ep_world_size:
        raise ValueError(
            f"{op}: shared_expert_rank_num={shared_expert_rank_num} must be in [0, ep_world_size={ep_world_size})"
        )
    if op in (DISPATCH, COMBINE):
        valid = shared_expert_num == 1
    else:
        valid = (
            shared_expert_num in (0, 1)
            and shared_expert_rank_num == 0
            or shared_expert_num > 0
            and shared_expert_rank_num // shared_expert_num > 0
            and shared_expert_rank_num % shared_expert_num == 0
        )
    if not valid:
        raise ValueError(
            f"{op}: shared_expert_num={shared_expert_num} with shared_expert_rank_num={shared_expert_rank_num} "
            "is not a setting the kernel accepts"
        )
    if expert_shard_type != 0:
        raise ValueError(f"{op}: expert_shard_type={expert_shard_type}: the kernel supports only 0 on A3")
    if shared_expert_rank_num != 0:
        raise NotImplementedError(
            f"{op}: shared-expert ranks (shared_expert_rank_num={shared_expert_rank_num}) are not emulated; "
            "vllm-ascend passes 0"
        )


def _check_mask_shape(op: str, x_active_mask: torch.Tensor | None, tokens: int, top_k: int) -> None:
    if x_active_mask is None:
        return
    if op in (DISPATCH, COMBINE):
        raise ValueError(
            f"{op}: x_active_mask is a reserved parameter of the v1 pair (keep the default None); "
            f"{DISPATCH_V2} / {COMBINE_V2} take it"
        )
    if x_active_mask.dtype != torch.bool:
        raise TypeError(f"{op}: x_active_mask must be bool, got {x_active_mask.dtype}")
    if tuple(x_active_mask.shape) not in ((tokens,), (tokens, top_k)):
        raise ValueError(
            f"{op}: x_active_mask must have shape (BS,) = ({tokens},) or (BS, K) = ({tokens}, {top_k}), "
            f"got {tuple(x_active_mask.shape)}"
        )


def active_slots(op: str, x_active_mask: torch.Tensor | None, tokens: int, top_k: int) -> torch.Tensor:
    """(BS*K,) bool on the CPU: which (t, k) slots take part, slot t*K + k."""
    if x_active_mask is None:
        return torch.ones(tokens * top_k, dtype=torch.bool)
    mask = x_active_mask.cpu()
    if mask.dim() == 2:
        return mask.reshape(-1)
    active = int(mask.sum())
    if not bool(mask[:active].all()):
        raise ValueError(
            f"{op}: a 1-D x_active_mask must list its True entries before its False ones, got {mask.int().tolist()}"
        )
    return mask.repeat_interleave(top_k)


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


def _gather_checked(op: str, problem: str | None, payload: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """All ranks' `payload` rows, [ranks, n]; every rank raises when any rank had a `problem` with its own
    inputs (that rank with its own message), so none is left waiting in a later exchange."""
    mine = torch.cat([torch.tensor([int(problem is not None)]), payload.long()])
    ranks = dist.get_world_size(group)
    # an all-gather as an all-to-all of one row each: gloo's all_gather copies into its outputs on its own thread,
    # which refuses the inference tensors vLLM's forward makes
    table = _exchange(mine.expand(ranks, -1), [1] * ranks, [1] * ranks, group)
    if problem is not None:
        raise ValueError(problem)
    refused = table[:, 0].nonzero().flatten().tolist()
    if refused:
        raise ValueError(f"{op}: EP rank(s) {refused} refused their inputs (their own errors say why)")
    return table[:, 1:]


@dataclass(frozen=True)
class _Received:
    """What one rank holds after the dispatch's exchange, in expand_x order (local expert, source rank, slot)."""

    rows: torch.Tensor  # (received, H)
    sources: torch.Tensor  # (received,) int64: the rank each row came from
    slots: torch.Tensor  # (received,) int64: its t*K + k on that rank
    counts: torch.Tensor  # [ep_world_size, L] int64: rows from source rank s for local expert l
    sent: torch.Tensor  # [ep_world_size, L] int64: this rank's slots per expert, by owning rank


def _send_to_experts(
    op: str,
    x: torch.Tensor,
    expert_ids: torch.Tensor,
    x_active_mask: torch.Tensor | None,
    layout: DispatchLayout,
    moe_expert_num: int,
    ep_rank_id: int,
    group: dist.ProcessGroup,
) -> _Received:
    ep_world_size, local, top_k = dist.get_world_size(group), layout.local_experts, layout.top_k
    flat = expert_ids.reshape(-1).long().cpu()
    problem = None
    try:
        active = active_slots(op, x_active_mask, layout.tokens, top_k)
        _check_choices(op, flat, top_k, moe_expert_num)
    except ValueError as e:
        problem, active = str(e), torch.zeros(flat.numel(), dtype=torch.bool)
    slots = active.nonzero().flatten()  # in (t, k) order
    experts = flat[slots]
    per_expert = torch.bincount(experts, minlength=moe_expert_num)
    # every rank sees every rank's counts, batch size and whether it masked anything: the same checks everywhere
    batch_and_mask = torch.tensor([layout.tokens, int(not bool(active.all()))])
    table = _gather_checked(op, problem, torch.cat([per_expert, batch_and_mask]), group)
    _check_group_table(op, table, layout, moe_expert_num)
    counts = table[:, :moe_expert_num].view(ep_world_size, ep_world_size, local)[:, ep_rank_id]  # [source, le]
    ordered = slots[torch.argsort(experts, stable=True)]  # by destination rank, local expert, then (t, k)
    send_splits = per_expert.view(ep_world_size, local).sum(dim=1).tolist()
    recv_splits = counts.sum(dim=1).tolist()
    rows = _exchange(x.cpu().index_select(0, ordered // top_k), send_splits, recv_splits, group)
    got_slots = _exchange(ordered, send_splits, recv_splits, group)
    regroup = blocks_in_other_order(counts.tolist(), rows.device)  # source-major -> local-expert-major
    sources = torch.repeat_interleave(torch.arange(ep_world_size), counts.sum(dim=1))
    return _Received(
        rows.index_select(0, regroup),
        sources.index_select(0, regroup),
        got_slots.index_select(0, regroup),
        counts,
        per_expert.view(ep_world_size, local),
    )


def _check_group_table(op: str, table: torch.Tensor, layout: DispatchLayout, moe_expert_num: int) -> None:
    """Rules over the whole group, from the gathered table (identical on every rank, so all ranks agree)."""
    batch, masked = table[:, moe_expert_num].tolist(), table[:, moe_expert_num + 1].tolist()
    if any(masked) and len(set(batch)) > 1:
        raise ValueError(
            f"{op}: EP rank(s) {[r for r, m in enumerate(masked) if m]} mask tokens (x_active_mask) while the ranks' "
            f"BS differ ({batch}): the kernel requires every token active when BS differs across ranks"
        )
    received = table[:, :moe_expert_num].view(len(batch), len(batch), -1).sum(dim=(0, 2)).tolist()
    over = [(rank, n) for rank, n in enumerate(received) if n > layout.rows]
    if over:
        rank, n = over[0]
        raise ValueError(
            f"{op}: rank {rank} is sent {n} rows, more than the kernel's bound A = global_bs x min(local experts, "
            f"K) = {layout.rows}: global_bs is too small"
        )


def _dispatch_outputs(
    x: torch.Tensor, got: _Received, layout: DispatchLayout, third: torch.Tensor, expert_token_nums_type: int
) -> tuple[torch.Tensor, ...]:
    received = got.rows.shape[0]
    expand_x = x.new_zeros(layout.expand_rows, x.shape[1], device="cpu")
    expand_x[:received] = got.rows
    per_local_expert = got.counts.sum(dim=0)
    if expert_token_nums_type == 0:
        per_local_expert = per_local_expert.cumsum(dim=0)
    device = x.device
    return (
        expand_x.to(device),
        torch.zeros(layout.expand_rows, dtype=torch.float32, device=device),
        third.to(device),
        per_local_expert.to(torch.int64).to(device),
        got.counts.t().reshape(-1).cumsum(dim=0).to(IDX).to(device),  # (local expert, source rank) order
        torch.zeros(layout.tp_world_size, dtype=IDX, device=device),
        torch.zeros(0, dtype=torch.float32, device=device),
    )


def _check_dispatch(op: str, call: DispatchArgs) -> DispatchLayout:
    x, expert_ids = call.x, call.expert_ids
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D (BS, H), got shape {tuple(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{op}: x must be floating point, got {x.dtype}")
    if expert_ids.dim() == 2 and expert_ids.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: expert_ids has {expert_ids.shape[0]} rows, x has {x.shape[0]}")
    if call.scales is not None:
        raise NotImplementedError(f"{op}: scales (quantised dispatch) are not emulated")
    if call.expert_scales is not None:
        raise NotImplementedError(f"{op}: expert_scales (A2's layered algorithm; A3 has none) are not emulated")
    if call.expert_token_nums_type not in (0, 1):
        raise ValueError(f"{op}: expert_token_nums_type must be 0 (cumsum) or 1 (counts)")
    layout = dispatch_layout(op, call, call.quant_mode)
    _check_mask_shape(op, call.x_active_mask, layout.tokens, layout.top_k)
    return layout


def _dispatched(op: str, call: DispatchArgs) -> tuple[DispatchLayout, _Received]:
    """The exchange both dispatch versions make (v1's x_active_mask is refused before it, so it is always None)."""
    layout = _check_dispatch(op, call)
    group = _ep_group(op, call.group_ep, call.ep_world_size, call.ep_rank_id)
    got = _send_to_experts(
        op, call.x, call.expert_ids, call.x_active_mask, layout, call.moe_expert_num, call.ep_rank_id, group
    )
    return layout, got


def npu_moe_distribute_dispatch(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The v1 dispatch (see the module docstring; arguments: `DispatchArgs`): expand_idx is its third output;
    x_active_mask is refused."""
    call = DispatchArgs(*args, **kwargs)
    layout, got = _dispatched(DISPATCH, call)
    flat = call.expert_ids.reshape(-1).long().cpu()
    order = torch.argsort(flat, stable=True)
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    sent = got.sent.reshape(-1)
    expand_idx = (position - (sent.cumsum(dim=0) - sent)[flat]).to(IDX)
    return _dispatch_outputs(call.x, got, layout, expand_idx, call.expert_token_nums_type)


def npu_moe_distribute_dispatch_v2(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The v2 dispatch (see the module docstring; arguments: `DispatchArgs`): masked slots stay home;
    assist_info_for_combine is third."""
    call = DispatchArgs(*args, **kwargs)
    layout, got = _dispatched(DISPATCH_V2, call)
    triples = torch.stack([got.sources, got.slots // layout.top_k, got.slots % layout.top_k], dim=1)
    assist = torch.zeros(layout.assist_words, dtype=IDX)
    assist[: triples.numel()] = triples.reshape(-1).to(IDX)
    return _dispatch_outputs(call.x, got, layout, assist, call.expert_token_nums_type)


def _dispatch_shapes(op: str, call: DispatchArgs) -> tuple[torch.Tensor, ...]:
    layout = _check_dispatch(op, call)
    group_named(call.group_ep, op)  # an unknown name fails at trace time, not at the first run
    x = call.x
    third = layout.tokens * layout.top_k if op == DISPATCH else layout.assist_words
    return (
        x.new_empty(layout.expand_rows, x.shape[1]),
        x.new_empty(layout.expand_rows, dtype=torch.float32),
        x.new_empty(third, dtype=IDX),
        x.new_empty(layout.local_experts, dtype=torch.int64),
        x.new_empty(call.ep_world_size * layout.local_experts, dtype=IDX),
        x.new_empty(layout.tp_world_size, dtype=IDX),
        x.new_empty(0, dtype=torch.float32),
    )


def dispatch_shapes(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The v1 dispatch outputs' shapes and dtypes, from the arguments alone (the fake implementation)."""
    return _dispatch_shapes(DISPATCH, DispatchArgs(*args, **kwargs))


def dispatch_v2_shapes(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
    """The v2 dispatch outputs' shapes and dtypes (assist_info_for_combine: max(BS*K, A*128) words)."""
    return _dispatch_shapes(DISPATCH_V2, DispatchArgs(*args, **kwargs))


def _check_combine(op: str, call: CombineArgs | CombineV2Args, third: torch.Tensor) -> DispatchLayout:
    """The arguments' checks; ``third`` is v1's expand_idx or v2's assist_info_for_combine."""
    expand_x, expert_ids, expert_scales = call.expand_x, call.expert_ids, call.expert_scales
    refused = ("expand_scales", "shared_expert_x")
    if op == COMBINE:
        refused += ("activation_scale", "weight_scale", "group_list")
    for name in refused:
        if getattr(call, name) is not None:
            raise NotImplementedError(f"{op}: {name} is not emulated (quantised, A2-only or shared-expert input)")
    if call.comm_quant_mode != 0:
        raise NotImplementedError(f"{op}: comm_quant_mode={call.comm_quant_mode} (int8 transfer) is not emulated")
    if expand_x.dim() != 2:
        raise ValueError(f"{op}: expand_x must be 2-D (A, H), got shape {tuple(expand_x.shape)}")
    layout = dispatch_layout(op, call, 0)
    _check_mask_shape(op, call.x_active_mask, layout.tokens, layout.top_k)
    if op == COMBINE:
        want, name = layout.tokens * layout.top_k, "expand_idx"
    else:
        want, name = layout.assist_words, "assist_info_for_combine"
        if expand_x.shape[0] != layout.expand_rows:
            raise ValueError(
                f"{op}: expand_x must have dispatch's A = {layout.expand_rows} rows, got {expand_x.shape[0]}"
            )
        if expert_scales.dtype != torch.float32:
            raise TypeError(f"{op}: expert_scales must be float32, got {expert_scales.dtype}")
        tp_counts = call.tp_send_counts
        if tp_counts is not None and tuple(tp_counts.shape) != (layout.tp_world_size,):
            raise ValueError(
                f"{op}: tp_send_counts must be dispatch's tp_recv_counts ({layout.tp_world_size},), "
                f"got {tuple(tp_counts.shape)}"
            )
    if tuple(third.shape) != (want,) or third.dtype != IDX:
        raise ValueError(f"{op}: {name} must be dispatch's, int32 ({want},), got {tuple(third.shape)} {third.dtype}")
    sends = call.ep_world_size * layout.local_experts
    ep_send_counts = call.ep_send_counts
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


def _held_rows(op: str, ep_send_counts: torch.Tensor, expand_rows: int) -> torch.Tensor:
    """Rows held per (local expert, source rank), from dispatch's cumulative ep_recv_counts."""
    ends = ep_send_counts.long().cpu()
    held = torch.diff(ends, prepend=ends.new_zeros(1))
    if held.numel() and (int(held.min()) < 0 or int(ends[-1]) > expand_rows):
        raise ValueError(f"{op}: ep_send_counts {ends.tolist()} are not dispatch's cumulative counts for expand_x")
    return held


def npu_moe_distribute_combine(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The v1 combine (see the module docstring; arguments: `CombineArgs`): the way back recomputed from
    expert_ids and expand_idx."""
    call = CombineArgs(*args, **kwargs)
    expand_x, ep_world_size, moe_expert_num = call.expand_x, call.ep_world_size, call.moe_expert_num
    layout = _check_combine(COMBINE, call, call.expand_idx)
    group = _ep_group(COMBINE, call.group_ep, ep_world_size, call.ep_rank_id)
    held = _held_rows(COMBINE, call.ep_send_counts, expand_x.shape[0])
    by_expert_then_source = held.view(layout.local_experts, ep_world_size)
    local_rows = expand_x.cpu()[: int(held.sum())]
    flat = call.expert_ids.reshape(-1).long().cpu()
    _check_choices(COMBINE, flat, layout.top_k, moe_expert_num)
    per_expert = torch.bincount(flat, minlength=moe_expert_num).view(ep_world_size, -1)
    back = _exchange(
        local_rows.index_select(0, blocks_in_other_order(by_expert_then_source.tolist(), local_rows.device)),
        by_expert_then_source.sum(dim=0).tolist(),
        per_expert.sum(dim=1).tolist(),
        group,
    )
    # `back` is in this rank's dispatch order (by expert, then (t, k)): slot (t, k) sits at its expert's first
    # row plus expand_idx[t*K + k]
    first_of_expert = per_expert.reshape(-1).cumsum(dim=0) - per_expert.reshape(-1)
    where = first_of_expert[flat] + call.expand_idx.long().cpu()
    picked = back.float().index_select(0, where).view(layout.tokens, layout.top_k, -1)
    out = (picked * call.expert_scales.float().cpu().unsqueeze(-1)).sum(dim=1)
    return out.to(expand_x.dtype).to(expand_x.device)


def _assist_problem(
    held: torch.Tensor, triples: torch.Tensor, layout: DispatchLayout, ep_world_size: int
) -> str | None:
    """Why assist_info_for_combine's triples do not fit ep_send_counts (one triple per held row, from each source
    rank as many as it sent, naming real ranks, tokens and slots), or None."""
    if triples.numel() == 0:
        return None
    sources, tokens, slots = triples.unbind(dim=1)
    lowest, highest = triples.min(dim=0).values.tolist(), [int(sources.max()), int(tokens.max()), int(slots.max())]
    if min(lowest) < 0 or highest[0] >= ep_world_size or highest[2] >= layout.top_k:
        return "assist_info_for_combine names a rank or slot that does not exist: it is not dispatch_v2's"
    per_source = torch.bincount(sources, minlength=ep_world_size)
    if not torch.equal(per_source, held.view(layout.local_experts, ep_world_size).sum(dim=0)):
        return (
            f"assist_info_for_combine's rows per source rank {per_source.tolist()} differ from ep_send_counts': "
            "the two are not from the same dispatch_v2"
        )
    return None


def npu_moe_distribute_combine_v2(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The v2 combine (see the module docstring; arguments: `CombineV2Args`): each row goes back to the rank and
    slot its triple in assist_info_for_combine names; masked slots add nothing."""
    op, call = COMBINE_V2, CombineV2Args(*args, **kwargs)
    expand_x, ep_world_size = call.expand_x, call.ep_world_size
    layout = _check_combine(op, call, call.assist_info_for_combine)
    group = _ep_group(op, call.group_ep, ep_world_size, call.ep_rank_id)
    flat = call.expert_ids.reshape(-1).long().cpu()
    try:
        held = _held_rows(op, call.ep_send_counts, expand_x.shape[0])
        triples = call.assist_info_for_combine.cpu().long()[: TRIPLE * int(held.sum())].view(-1, TRIPLE)
        active = active_slots(op, call.x_active_mask, layout.tokens, layout.top_k)
        _check_choices(op, flat, layout.top_k, call.moe_expert_num)
        problem = _assist_problem(held, triples, layout, ep_world_size)
        problem = f"{op}: {problem}" if problem else None
    except ValueError as e:
        problem = str(e)
    if problem is not None:  # still joins the check below, with nothing to send, so that every rank stops
        triples, active = torch.zeros(0, TRIPLE, dtype=torch.long), torch.zeros(flat.numel(), dtype=torch.bool)
    send_to = torch.bincount(triples[:, 0], minlength=ep_world_size)
    expect_from = torch.bincount(flat[active] // layout.local_experts, minlength=ep_world_size)
    # every rank checks every pair: what r sends d is what d expects from r
    table = _gather_checked(op, problem, torch.cat([send_to, expect_from]), group)
    mismatched = (table[:, :ep_world_size] != table[:, ep_world_size:].t()).nonzero().tolist()
    if mismatched:
        raise ValueError(
            f"{op}: (sender, receiver) rank pairs {mismatched} disagree on the rows coming back: x_active_mask or "
            "expert_ids differ from the ones dispatch_v2 was given"
        )
    order = torch.argsort(triples[:, 0], stable=True)
    slot_of_row = triples[:, 1] * layout.top_k + triples[:, 2]
    send, recv = send_to.tolist(), expect_from.tolist()
    rows = _exchange(expand_x.cpu()[: triples.shape[0]].index_select(0, order), send, recv, group)
    slots = _exchange(slot_of_row.index_select(0, order), send, recv, group)
    if not torch.equal(torch.bincount(slots, minlength=flat.numel()), active.long()):
        raise ValueError(f"{op}: the rows that came back do not cover this rank's active slots once each")
    gathered = torch.zeros(flat.numel(), expand_x.shape[1], dtype=torch.float32)
    gathered[slots] = rows.float()
    weighted = gathered.view(layout.tokens, layout.top_k, -1) * call.expert_scales.float().cpu().unsqueeze(-1)
    return weighted.sum(dim=1).to(expand_x.dtype).to(expand_x.device)


def _combine_shapes(op: str, call: CombineArgs | CombineV2Args, third: torch.Tensor) -> torch.Tensor:
    layout = _check_combine(op, call, third)
    group_named(call.group_ep, op)
    return call.expand_x.new_empty(layout.tokens, call.expand_x.shape[1])


def combine_shapes(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The v1 combine output's shape and dtype (BS, H), from the arguments alone (the fake implementation)."""
    call = CombineArgs(*args, **kwargs)
    return _combine_shapes(COMBINE, call, call.expand_idx)


def combine_v2_shapes(*args: Any, **kwargs: Any) -> torch.Tensor:
    """The v2 combine output's shape and dtype (BS, H), from the arguments alone (the fake implementation)."""
    call = CombineV2Args(*args, **kwargs)
    return _combine_shapes(COMBINE_V2, call, call.assist_info_for_combine)
