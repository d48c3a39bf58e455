"""MoE routing for inference: the torch_npu ops vllm-ascend's fused MoE layer calls around the expert matmuls.

* ``npu_moe_gating_top_k``: sigmoid/softmax scores, (bias-corrected) group-limited top-k (DeepSeek-V3 routing);
* ``npu_moe_gating_top_k_softmax``: softmax, top-k, and the row index ``k * T + t``;
* ``npu_moe_init_routing``: token copies sorted by expert (``expanded_row_idx`` maps slot ``k*T + t`` to its row);
* ``npu_moe_compute_expert_tokens``: cumulative row end of each expert in an expert-sorted list;
* ``npu_moe_finalize_routing``: the weighted sum of each token's expert outputs, back in token order;
* ``npu_moe_re_routing``: rows received rank-major / expert-minor, regrouped expert-major / rank-minor.

Each function has the op's arguments and outputs (the `*_shapes` functions give the outputs' shapes and
dtypes from the arguments alone: they are the fake implementations the custom-op registry uses). Sums and
normalisations run in fp32 and are cast to the input's dtype, as on the NPU. Inference only: no backward.
"""

from __future__ import annotations

import torch

IDX = torch.int32  # every index output of these ops is int32


def _int_tensor(t: torch.Tensor, what: str, op: str, dtypes: tuple[torch.dtype, ...] = (IDX,)) -> None:
    if t.dtype not in dtypes:
        raise TypeError(f"{op}: {what} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")


def _descending(values: torch.Tensor) -> torch.Tensor:
    """Indices sorting the last dim in descending order; equal values keep the lower index first (the
    kernel's order for ties, and deterministic where torch.topk is not)."""
    return torch.sort(values, dim=-1, descending=True, stable=True).indices


# ---- npu_moe_gating_top_k ---------------------------------------------------------------------------------------
def _check_gating_top_k(
    x: torch.Tensor, k: int, bias: torch.Tensor | None, k_group: int, group_count: int, group_select_mode: int
) -> None:
    op = "npu_moe_gating_top_k"
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D (tokens, experts), got shape {tuple(x.shape)}")
    experts = x.shape[-1]
    if bias is not None:
        if bias.shape != (experts,):
            raise ValueError(f"{op}: bias must have shape ({experts},), got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"{op}: bias dtype {bias.dtype} differs from x dtype {x.dtype} (the kernel requires one)")
    if group_count < 1 or experts % group_count:
        raise ValueError(f"{op}: group_count={group_count} must divide the {experts} experts")
    if not 1 <= k_group <= group_count:
        raise ValueError(f"{op}: k_group={k_group} must be in [1, group_count={group_count}]")
    if group_select_mode not in (0, 1):
        raise ValueError(f"{op}: group_select_mode must be 0 (group max) or 1 (sum of group top-2)")
    if group_count > 1 and group_select_mode == 1 and experts // group_count < 2:
        raise ValueError(f"{op}: group_select_mode=1 sums each group's top 2 but groups have {experts // group_count}")
    if not 1 <= k <= experts // group_count * k_group:
        raise ValueError(
            f"{op}: k={k} must be in [1, experts/group_count*k_group = {experts // group_count * k_group}]"
        )


def npu_moe_gating_top_k(
    x: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    k_group: int = 1,
    group_count: int = 1,
    group_select_mode: int = 0,
    renorm: int = 0,
    norm_type: int = 0,
    out_flag: bool = False,
    routed_scaling_factor: float = 1.0,
    eps: float = 1e-20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The kernel's documented computation (aclnnMoeGatingTopK): norm = softmax(x) (norm_type 0) or sigmoid(x)
    (1); experts are chosen on norm + bias: the k_group best of group_count groups (a group scores its max,
    group_select_mode 0, or the sum of its top 2, mode 1; ties to the lower index), the other groups' experts
    at -inf, then the top k experts; y = norm (without the bias) at the chosen experts, divided by (sum + eps)
    for sigmoid or when renorm=1 with softmax (renorm has no effect with sigmoid), times routed_scaling_factor.
    Returns (y [T, k] in x's dtype, expert_idx [T, k] int32, norm [T, E] fp32)."""
    _check_gating_top_k(x, k, bias, k_group, group_count, group_select_mode)
    if renorm not in (0, 1):
        raise ValueError(f"npu_moe_gating_top_k: renorm must be 0 or 1, got {renorm}")
    if norm_type not in (0, 1):
        raise ValueError(f"npu_moe_gating_top_k: norm_type must be 0 (softmax) or 1 (sigmoid), got {norm_type}")
    del out_flag  # norm is the third output when asked for; filled here either way (the Meta function sizes it)
    norm = torch.softmax(x.float(), dim=-1) if norm_type == 0 else torch.sigmoid(x.float())
    choice = norm + bias.float() if bias is not None else norm
    tokens, experts = x.shape
    if group_count > 1:
        grouped = choice.view(tokens, group_count, experts // group_count)
        if group_select_mode == 0:
            score = grouped.amax(dim=-1)
        else:
            score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        kept = torch.zeros_like(score, dtype=torch.bool).scatter_(1, _descending(score)[:, :k_group], True)
        choice = grouped.masked_fill(~kept.unsqueeze(-1), float("-inf")).view(tokens, experts)
    expert_idx = _descending(choice)[:, :k]
    y = norm.gather(1, expert_idx)
    if norm_type == 1 or renorm == 1:
        y = y / (y.sum(dim=-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    return y.to(x.dtype), expert_idx.to(IDX), norm


def gating_top_k_shapes(x: torch.Tensor, k: int, **kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_gating_top_k(
        x,
        k,
        kwargs.get("bias"),
        kwargs.get("k_group", 1),
        kwargs.get("group_count", 1),
        kwargs.get("group_select_mode", 0),
    )
    tokens, experts = x.shape
    return x.new_empty(tokens, k), x.new_empty(tokens, k, dtype=IDX), x.new_empty(tokens, experts, dtype=torch.float32)


# ---- npu_moe_gating_top_k_softmax ------------------------------------------------------------------------------
def _check_gating_softmax(x: torch.Tensor, finished: torch.Tensor | None, k: int) -> None:
    op = "npu_moe_gating_top_k_softmax"
    if x.dim() not in (2, 3):
        raise ValueError(f"{op}: x must be 2-D or 3-D, got shape {tuple(x.shape)}")
    if not 1 <= k <= x.shape[-1]:
        raise ValueError(f"{op}: k={k} must be in [1, {x.shape[-1]}]")
    if finished is not None:
        raise NotImplementedError(f"{op}: `finished` rows are not emulated (vllm-ascend passes None)")


def npu_moe_gating_top_k_softmax(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, expert_idx) = top-k of softmax(x) over the last dim; row_idx[t, j] = j * T + t over the T rows."""
    _check_gating_softmax(x, finished, k)
    probs = torch.softmax(x.float(), dim=-1)
    expert_idx = _descending(probs)[..., :k]
    y = probs.gather(-1, expert_idx)
    rows = expert_idx[..., 0].numel()
    row_idx = torch.arange(rows * k, dtype=IDX, device=x.device).view(k, rows).t().reshape(expert_idx.shape)
    return y.to(x.dtype), expert_idx.to(IDX), row_idx


def gating_top_k_softmax_shapes(
    x: torch.Tensor, finished: torch.Tensor | None = None, k: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_gating_softmax(x, finished, k)
    shape = (*x.shape[:-1], k)
    return x.new_empty(shape), x.new_empty(shape, dtype=IDX), x.new_empty(shape, dtype=IDX)


# ---- npu_moe_init_routing --------------------------------------------------------------------------------------
def _check_init_routing(x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int) -> None:
    op = "npu_moe_init_routing"
    if x.dim() != 2:
        raise ValueError(f"{op}: x must be 2-D (tokens, hidden), got shape {tuple(x.shape)}")
    if expert_idx.dim() != 2 or expert_idx.shape[0] != x.shape[0]:
        raise ValueError(f"{op}: expert_idx must be ({x.shape[0]}, K), got shape {tuple(expert_idx.shape)}")
    if row_idx.shape != expert_idx.shape:
        raise ValueError(
            f"{op}: row_idx shape {tuple(row_idx.shape)} differs from expert_idx {tuple(expert_idx.shape)}"
        )
    _int_tensor(expert_idx, "expert_idx", op)
    _int_tensor(row_idx, "row_idx", op)
    if active_num < 0:
        raise ValueError(f"{op}: active_num must be >= 0, got {active_num}")


def npu_moe_init_routing(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the T*K (token, k) slots by expert, stably in flattened order: expanded_expert_idx is the sorted
    experts, sorted_row = row_idx at the sorted slots, expanded_row_idx[sorted_row[i]] = i, and expanded_x[i] =
    x[sorted_row[i] % T] for the first min(active_num, T) * K rows."""
    _check_init_routing(x, row_idx, expert_idx, active_num)
    tokens, k = expert_idx.shape
    slots = tokens * k
    flat_rows = row_idx.reshape(-1).long()
    if slots and not torch.equal(torch.sort(flat_rows).values, torch.arange(slots, device=flat_rows.device)):
        raise ValueError(f"npu_moe_init_routing: row_idx must hold each of 0..{slots - 1} once")
    flat_experts = expert_idx.reshape(-1)
    order = torch.argsort(flat_experts, stable=True)
    sorted_rows = flat_rows[order]
    expanded_row_idx = torch.empty(slots, dtype=IDX, device=x.device)
    expanded_row_idx[sorted_rows] = torch.arange(slots, dtype=IDX, device=x.device)
    active = min(active_num, tokens) * k
    expanded_x = x.index_select(0, sorted_rows[:active] % tokens) if tokens else x.new_empty(0, x.shape[1])
    return expanded_x, expanded_row_idx, flat_experts[order].to(IDX)


def init_routing_shapes(
    x: torch.Tensor, row_idx: torch.Tensor, expert_idx: torch.Tensor, active_num: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_init_routing(x, row_idx, expert_idx, active_num)
    tokens, k = expert_idx.shape
    return (
        x.new_empty(min(active_num, tokens) * k, x.shape[1]),
        x.new_empty(tokens * k, dtype=IDX),
        x.new_empty(tokens * k, dtype=IDX),
    )


# ---- npu_moe_compute_expert_tokens -----------------------------------------------------------------------------
def _check_expert_tokens(sorted_experts: torch.Tensor, num_expert: int) -> None:
    op = "npu_moe_compute_expert_tokens"
    if sorted_experts.dim() != 1:
        raise ValueError(f"{op}: sorted_expert_for_source_row must be 1-D, got shape {tuple(sorted_experts.shape)}")
    _int_tensor(sorted_experts, "sorted_expert_for_source_row", op, (torch.int32, torch.int64))
    if num_expert < 1:
        raise ValueError(f"{op}: num_expert must be >= 1, got {num_expert}")


def npu_moe_compute_expert_tokens(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    """out[e] = the end (exclusive) of expert e's rows in the expert-sorted list, i.e. how many entries are <= e:
    a cumulative group_list for npu_grouped_matmul (group_list_type 0). Same dtype as the input."""
    _check_expert_tokens(sorted_expert_for_source_row, num_expert)
    experts = sorted_expert_for_source_row
    if experts.numel():
        if bool((experts[1:] < experts[:-1]).any()):
            raise ValueError(
                "npu_moe_compute_expert_tokens: sorted_expert_for_source_row is not sorted (non-decreasing)"
            )
        if int(experts[0]) < 0 or int(experts[-1]) >= num_expert:
            raise ValueError(f"npu_moe_compute_expert_tokens: expert ids must be in [0, {num_expert})")
    bounds = torch.arange(num_expert, dtype=experts.dtype, device=experts.device)
    return torch.searchsorted(experts.contiguous(), bounds, right=True).to(experts.dtype)


def expert_tokens_shapes(sorted_expert_for_source_row: torch.Tensor, num_expert: int) -> torch.Tensor:
    _check_expert_tokens(sorted_expert_for_source_row, num_expert)
    return sorted_expert_for_source_row.new_empty(num_expert)


# ---- npu_moe_finalize_routing ----------------------------------------------------------------------------------
def _finalize_tokens(
    expanded: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    src_to_dst: torch.Tensor,
    experts: torch.Tensor | None,
    drop_pad_mode: int | None,
) -> tuple[int, int]:
    """Checks the arguments; returns (T, K)."""
    op = "npu_moe_finalize_routing"
    if expanded.dim() != 2:
        raise ValueError(f"{op}: expanded_permuted_rows must be 2-D, got shape {tuple(expanded.shape)}")
    if drop_pad_mode not in (0, None):
        raise NotImplementedError(f"{op}: drop_pad_mode={drop_pad_mode} is not emulated (only the dropless mode 0)")
    if skip2 is not None and skip1 is None:
        raise ValueError(f"{op}: skip2 needs skip1")
    if bias is not None and experts is None:
        raise ValueError(f"{op}: bias needs export_for_source_row (the expert of each slot)")
    _int_tensor(src_to_dst, "expanded_src_to_dst_row", op)
    if src_to_dst.dim() != 1:
        raise ValueError(f"{op}: expanded_src_to_dst_row must be 1-D, got shape {tuple(src_to_dst.shape)}")
    for name, t in (("scales", scales), ("export_for_source_row", experts)):
        if t is not None and t.dim() != 2:
            raise ValueError(f"{op}: {name} must be 2-D (tokens, K), got shape {tuple(t.shape)}")
    sized = scales if scales is not None else experts
    if sized is not None:
        tokens, k = sized.shape
    elif skip1 is not None:
        tokens = skip1.shape[0]
        k = src_to_dst.numel() // tokens if tokens else 0
    else:
        raise ValueError(f"{op}: the token count comes from scales, export_for_source_row or skip1; all are None")
    if src_to_dst.numel() != tokens * k:
        raise ValueError(f"{op}: expanded_src_to_dst_row has {src_to_dst.numel()} entries for {tokens} tokens x K={k}")
    for name, t in (("scales", scales), ("export_for_source_row", experts)):
        if t is not None and tuple(t.shape) != (tokens, k):
            raise ValueError(f"{op}: {name} must have shape ({tokens}, {k}), got {tuple(t.shape)}")
    for name, t in (("skip1", skip1), ("skip2", skip2)):
        if t is not None and tuple(t.shape) != (tokens, expanded.shape[1]):
            raise ValueError(f"{op}: {name} must have shape ({tokens}, {expanded.shape[1]}), got {tuple(t.shape)}")
    return tokens, k


def npu_moe_finalize_routing(
    expanded_permuted_rows: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    expanded_src_to_dst_row: torch.Tensor,
    export_for_source_row: torch.Tensor | None,
    drop_pad_mode: int | None = 0,
) -> torch.Tensor:
    """out[t] = skip1[t] + skip2[t] + sum_k scales[t, k] * (rows[src_to_dst[k*T + t]] + bias[expert[t, k]])
    (missing terms left out, scales 1 when None), computed in fp32, in the rows' dtype."""
    tokens, k = _finalize_tokens(
        expanded_permuted_rows,
        skip1,
        skip2,
        bias,
        scales,
        expanded_src_to_dst_row,
        export_for_source_row,
        drop_pad_mode,
    )
    hidden = expanded_permuted_rows.shape[1]
    where = expanded_src_to_dst_row.long().view(k, tokens)
    if where.numel() and (int(where.min()) < 0 or int(where.max()) >= expanded_permuted_rows.shape[0]):
        raise ValueError(
            f"npu_moe_finalize_routing: expanded_src_to_dst_row points outside the "
            f"{expanded_permuted_rows.shape[0]} expanded rows"
        )
    picked = expanded_permuted_rows.float()[where]  # [K, T, H]
    if bias is not None:
        picked = picked + bias.float()[export_for_source_row.long().t()]
    if scales is not None:
        picked = picked * scales.float().t().unsqueeze(-1)
    out = picked.sum(dim=0) if k else expanded_permuted_rows.new_zeros(tokens, hidden, dtype=torch.float32)
    for skip in (skip1, skip2):
        if skip is not None:
            out = out + skip.float()
    return out.to(expanded_permuted_rows.dtype)


def finalize_routing_shapes(
    expanded_permuted_rows: torch.Tensor,
    skip1: torch.Tensor | None,
    skip2: torch.Tensor | None,
    bias: torch.Tensor | None,
    scales: torch.Tensor | None,
    expanded_src_to_dst_row: torch.Tensor,
    export_for_source_row: torch.Tensor | None,
    drop_pad_mode: int | None = 0,
) -> torch.Tensor:
    tokens, _ = _finalize_tokens(
        expanded_permuted_rows,
        skip1,
        skip2,
        bias,
        scales,
        expanded_src_to_dst_row,
        export_for_source_row,
        drop_pad_mode,
    )
    return expanded_permuted_rows.new_empty(tokens, expanded_permuted_rows.shape[1])


# ---- npu_moe_re_routing ----------------------------------------------------------------------------------------
def _check_re_routing(
    tokens: torch.Tensor, counts: torch.Tensor, scales: torch.Tensor | None, count_type: int, idx_type: int
) -> None:
    op = "npu_moe_re_routing"
    if tokens.dim() != 2:
        raise ValueError(f"{op}: tokens must be 2-D, got shape {tuple(tokens.shape)}")
    if counts.dim() != 2:
        raise ValueError(f"{op}: expert_token_num_per_rank must be 2-D (ranks, experts), got {tuple(counts.shape)}")
    _int_tensor(counts, "expert_token_num_per_rank", op, (torch.int32, torch.int64))
    if scales is not None and tuple(scales.shape) != (tokens.shape[0],):
        raise ValueError(f"{op}: per_token_scales must have shape ({tokens.shape[0]},), got {tuple(scales.shape)}")
    if count_type not in (0, 1):
        raise ValueError(f"{op}: expert_token_num_type must be 0 (cumsum) or 1 (counts), got {count_type}")
    if idx_type != 0:
        raise NotImplementedError(f"{op}: idx_type={idx_type} is not emulated (the kernel supports only 0, gather)")


def npu_moe_re_routing(
    tokens: torch.Tensor,
    expert_token_num_per_rank: torch.Tensor,
    *,
    per_token_scales: torch.Tensor | None = None,
    expert_token_num_type: int = 1,
    idx_type: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens arrive as blocks (rank i, expert j) in rank-major order, counts[i, j] rows each; returns them in
    expert-major order (permute_tokens, the scales moved alike, permute_token_idx[r] = source row of row r) and
    the rows per expert (counts summed over ranks; cumulative when expert_token_num_type is 0)."""
    _check_re_routing(tokens, expert_token_num_per_rank, per_token_scales, expert_token_num_type, idx_type)
    counts = expert_token_num_per_rank
    if int(counts.sum()) != tokens.shape[0]:
        raise ValueError(
            f"npu_moe_re_routing: the counts add to {int(counts.sum())}, tokens has {tokens.shape[0]} rows"
        )
    if counts.numel() and int(counts.min()) < 0:
        raise ValueError("npu_moe_re_routing: expert_token_num_per_rank has a negative count")
    source = blocks_in_other_order(counts.tolist(), tokens.device)
    scales = (
        per_token_scales.float().index_select(0, source)
        if per_token_scales is not None
        else tokens.new_zeros(tokens.shape[0], dtype=torch.float32)
    )
    per_expert = counts.sum(dim=0)
    if expert_token_num_type == 0:
        per_expert = per_expert.cumsum(dim=0)
    return tokens.index_select(0, source), scales, source.to(IDX), per_expert.to(counts.dtype)


def blocks_in_other_order(counts: list[list[int]], device: torch.device) -> torch.Tensor:
    """Rows laid out as blocks [i][j] (i-major), listed as blocks [j][i] (j-major): the source row of each."""
    starts, at = [], 0
    for row in counts:
        starts.append([])
        for c in row:
            starts[-1].append(at)
            at += c
    parts = [
        torch.arange(starts[i][j], starts[i][j] + counts[i][j], device=device)
        for j in range(len(counts[0]) if counts else 0)
        for i in range(len(counts))
    ]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long, device=device)


def re_routing_shapes(
    tokens: torch.Tensor,
    expert_token_num_per_rank: torch.Tensor,
    *,
    per_token_scales: torch.Tensor | None = None,
    expert_token_num_type: int = 1,
    idx_type: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    _check_re_routing(tokens, expert_token_num_per_rank, per_token_scales, expert_token_num_type, idx_type)
    rows = tokens.shape[0]
    return (
        tokens.new_empty(tokens.shape),
        tokens.new_empty(rows, dtype=torch.float32),
        tokens.new_empty(rows, dtype=IDX),
        expert_token_num_per_rank.new_empty(expert_token_num_per_rank.shape[1]),
    )
