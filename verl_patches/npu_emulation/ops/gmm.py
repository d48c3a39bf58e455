"""Grouped matmul: MindSpeed's npu_gmm builder ops (forward, backward, backward with the weight
gradient fused into main_grad) and the ATB GroupMatmulAdd / MatmulAdd gradient-accumulation ops.

group_list_type 0: group_list holds cumulative row ends per expert; type 1: the row count per expert.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def group_bounds(
    group_list: torch.Tensor | Sequence[int] | None, group_list_type: int, rows: int, groups: int
) -> list[tuple[int, int]]:
    """[(start, end)] rows of each group; checks that the groups cover exactly `rows` rows."""
    if group_list is None:
        if groups != 1:
            raise ValueError(f"npu_gmm: group_list is required for {groups} weight groups")
        return [(0, rows)]
    values = [int(v) for v in (group_list.tolist() if isinstance(group_list, torch.Tensor) else group_list)]
    if group_list_type == 1:
        ends, acc = [], 0
        for v in values:
            acc += v
            ends.append(acc)
    elif group_list_type == 0:
        ends = values
    else:
        raise ValueError(f"npu_gmm: group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type!r}")
    if len(ends) != groups:
        raise ValueError(f"npu_gmm: group_list has {len(ends)} entries for {groups} weight groups")
    if any(b < a for a, b in zip([0] + ends, ends)) or (ends and ends[-1] > rows):
        raise ValueError(f"npu_gmm: group_list {values} (type {group_list_type}) does not split {rows} rows")
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, group_list, group_list_type: int) -> torch.Tensor:
    """y[rows of group e] = x[rows of group e] @ weight[e]; x [M,K], weight [E,K,N] -> y [M,N]."""
    w = weight if weight.dim() == 3 else weight.unsqueeze(0)
    bounds = group_bounds(group_list, group_list_type, x.shape[0], w.shape[0])
    parts = [x[a:b] @ w[e] for e, (a, b) in enumerate(bounds)]
    tail = x.shape[0] - (bounds[-1][1] if bounds else 0)
    if tail:
        parts.append(x.new_zeros((tail, w.shape[-1])))
    return torch.cat(parts, dim=0) if parts else x.new_zeros((0, w.shape[-1]))


def npu_gmm(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    bias: Sequence[torch.Tensor],
    group_list,
    group_type: int,
    group_list_type: int,
) -> list[torch.Tensor]:
    """The builder op: lists of one x, one weight, optional bias; group_type 0 splits x's rows."""
    if group_type != 0:
        raise NotImplementedError(f"npu_gmm on CPU: group_type {group_type} is not emulated (training uses 0)")
    y = grouped_matmul(x[0], weight[0], group_list, group_list_type)
    if bias:
        b = bias[0]
        bounds = group_bounds(group_list, group_list_type, x[0].shape[0], b.shape[0] if b.dim() == 2 else 1)
        y = y.clone()
        for e, (lo, hi) in enumerate(bounds):
            y[lo:hi] += b[e] if b.dim() == 2 else b
    return [y]


def _grad_x(dy: torch.Tensor, weight: torch.Tensor, group_list, group_list_type: int) -> torch.Tensor:
    return grouped_matmul(dy, weight.transpose(-1, -2), group_list, group_list_type)


def grouped_weight_grad(
    x: torch.Tensor, dy: torch.Tensor, group_list, group_list_type: int, groups: int
) -> torch.Tensor:
    """dw[e] = x[rows of e]^T @ dy[rows of e] -> [E,K,N]."""
    bounds = group_bounds(group_list, group_list_type, x.shape[0], groups)
    return torch.stack([x[a:b].transpose(0, 1) @ dy[a:b] for a, b in bounds], dim=0)


def npu_gmm_backward(
    grad: Sequence[torch.Tensor],
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    group_list,
    group_list_type: int,
) -> tuple[list, list, list]:
    w = weight[0]
    dx = _grad_x(grad[0], w, group_list, group_list_type)
    groups = w.shape[0] if w.dim() == 3 else 1
    dw = grouped_weight_grad(x[0], grad[0], group_list, group_list_type, groups)
    return [dx], [dw.view_as(w)], []


def npu_gmm_backward_fusion(
    grad: Sequence[torch.Tensor], weight: Sequence[torch.Tensor], group_list, group_list_type: int
) -> tuple[list, list, list]:
    """Only dx: the weight gradient goes straight into main_grad through npu_groupmatmul_add_fp32."""
    return [_grad_x(grad[0], weight[0], group_list, group_list_type)], [], []


def npu_groupmatmul_add_fp32(x: torch.Tensor, dy: torch.Tensor, group_list, grad: torch.Tensor) -> None:
    """grad[e] += x[rows of e]^T @ dy[rows of e] in fp32 (group_list cumulative), in place; grad is the
    main_grad of the stacked expert weight, any shape holding E * K * N elements."""
    groups = len(group_list)
    k, n = x.shape[-1], dy.shape[-1]
    if grad.numel() != groups * k * n:
        raise ValueError(f"npu_groupmatmul_add_fp32: grad has {grad.numel()} elements, expected {groups}x{k}x{n}")
    dw = grouped_weight_grad(x.float(), dy.float(), group_list, 0, groups)
    grad.view(groups, k, n).add_(dw.to(grad.dtype))


def npu_matmul_add_fp32(grad_output: torch.Tensor, total_input: torch.Tensor, grad: torch.Tensor) -> None:
    """The builder op as MindSpeed calls it (dy first): grad += dy^T @ x in fp32, in place
    (dense-layer gradient-accumulation fusion)."""
    go = grad_output.reshape(-1, grad_output.shape[-1]).float()
    ti = total_input.reshape(-1, total_input.shape[-1]).float()
    grad.add_((go.t() @ ti).to(grad.dtype))
