"""torch_npu.npu_grouped_matmul, the list form vllm-ascend's fused MoE calls (not MindSpeed's npu_gmm builder
op, which is ops/gmm.py; the row-group math is shared with it).

Emulated, unquantized:

* group_type 0 (groups along M): one x [M, K], the weights as one [E, K, N] tensor or E tensors [K, N], a
  group_list of E entries (group_list_type 0: cumulative row ends, 1: rows per group); y rows of group e =
  x rows of group e @ w[e] (+ bias[e]); rows after the last group are zeros (the NPU leaves them undefined).
  split_item 2 or 3: one output [M, N]. split_item 0 or 1 would give one output per group, whose row counts
  depend on group_list's values: not emulated (vLLM-Ascend uses 2).
* group_type -1 or None (no grouping): y_i = x_i @ w_i (+ bias_i) for each pair; split_item 0/1: one output
  each, 2/3: the outputs concatenated along dim 0.

Outputs are in output_dtype (default x's dtype). The quantisation arguments, act_type != 0 and group_type 2
(groups along K) raise NotImplementedError; the A3 profile runs unquantized.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

import torch

from verl_patches.npu_emulation.ops.gmm import grouped_matmul

OP = "npu_grouped_matmul"
QUANT_ARGS = (
    "scale",
    "offset",
    "antiquant_scale",
    "antiquant_offset",
    "per_token_scale",
    "activation_input",
    "activation_quant_scale",
    "activation_quant_offset",
)


def _grouped_weight_shape(weight: Sequence[torch.Tensor]) -> tuple[int, int, int]:
    """(E, K, N) of the per-group weights: one [E, K, N] tensor or E tensors [K, N]."""
    if len(weight) == 1 and weight[0].dim() == 3:
        return tuple(weight[0].shape)
    shapes = {tuple(w.shape) for w in weight}
    if all(w.dim() == 2 for w in weight) and len(shapes) == 1:
        return (len(weight), *shapes.pop())
    raise ValueError(
        f"{OP}: group_type 0 takes one [E, K, N] weight or E weights of one shape [K, N], "
        f"got {[tuple(w.shape) for w in weight]}"
    )


def _stacked_weight(weight: Sequence[torch.Tensor]) -> torch.Tensor:
    return weight[0] if len(weight) == 1 and weight[0].dim() == 3 else torch.stack(list(weight))


def _check(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    bias: Sequence[torch.Tensor] | None,
    group_list: torch.Tensor | None,
    split_item: int | None,
    group_type: int | None,
    group_list_type: int | None,
    act_type: int | None,
    quant: dict[str, Sequence[torch.Tensor] | None],
) -> None:
    """Everything checkable without reading tensor values (shared by the op and its fake)."""
    given = [name for name, value in quant.items() if value]
    if given:
        raise NotImplementedError(f"{OP}: quantized grouped matmul ({', '.join(given)}) is not emulated")
    if act_type not in (0, None):
        raise NotImplementedError(f"{OP}: act_type={act_type} (fused activation) is not emulated")
    if split_item not in (0, 1, 2, 3, None):
        raise ValueError(f"{OP}: split_item must be 0, 1, 2 or 3, got {split_item}")
    if not x or not weight:
        raise ValueError(f"{OP}: x and weight must be non-empty lists")
    if group_type == 0:
        if len(x) != 1 or x[0].dim() != 2:
            raise ValueError(f"{OP}: group_type 0 takes one 2-D x, got {[tuple(t.shape) for t in x]}")
        groups, k, n = _grouped_weight_shape(weight)
        if k != x[0].shape[1]:
            raise ValueError(f"{OP}: x is [M, {x[0].shape[1]}] but the weights are [E, K, N] = [{groups}, {k}, {n}]")
        if group_list is None or group_list.dim() != 1 or group_list.numel() != groups:
            got = None if group_list is None else tuple(group_list.shape)
            raise ValueError(
                f"{OP}: group_type 0 needs a 1-D group_list of {groups} entries (one per group), got {got}"
            )
        if group_list_type not in (0, 1):
            raise NotImplementedError(f"{OP}: group_list_type={group_list_type} is not emulated (0 cumsum, 1 counts)")
        if split_item in (0, 1, None):
            raise NotImplementedError(
                f"{OP}: split_item={split_item} with group_type 0 returns one tensor per group, sized by group_list's "
                "values; not emulated (vllm-ascend uses split_item=2)"
            )
        if bias and (len(bias) != 1 or tuple(bias[0].shape) != (groups, n)):
            raise ValueError(f"{OP}: bias for group_type 0 must be one [{groups}, {n}] tensor")
    elif group_type in (-1, None):
        if len(x) != len(weight):
            raise ValueError(f"{OP}: without grouping x and weight pair up, got {len(x)} and {len(weight)} tensors")
        for i, (xi, wi) in enumerate(zip(x, weight)):
            if wi.dim() != 2 or xi.shape[-1] != wi.shape[0]:
                raise ValueError(f"{OP}: x[{i}] {tuple(xi.shape)} does not multiply weight[{i}] {tuple(wi.shape)}")
        if bias and len(bias) != len(weight):
            raise ValueError(f"{OP}: bias must have one tensor per weight, got {len(bias)} for {len(weight)}")
        if group_list is not None:
            raise ValueError(f"{OP}: group_list is given but group_type={group_type} groups nothing")
    else:
        raise NotImplementedError(f"{OP}: group_type={group_type} is not emulated (-1 none, 0 along M)")


def _rows_of_groups(group_list: torch.Tensor, group_list_type: int, rows: int) -> list[int]:
    """The cumulative row ends of the groups, checked against x's rows."""
    values = [int(v) for v in group_list.tolist()]
    if any(v < 0 for v in values):
        raise ValueError(f"{OP}: group_list {values} has a negative entry")
    ends = values if group_list_type == 0 else list(accumulate(values))
    if any(b < a for a, b in zip([0] + ends, ends)):
        raise ValueError(f"{OP}: group_list {values} is cumulative (group_list_type 0) but decreases")
    if ends and ends[-1] > rows:
        raise ValueError(f"{OP}: group_list {values} (type {group_list_type}) covers {ends[-1]} rows, x has {rows}")
    return ends


def npu_grouped_matmul(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    scale: Sequence[torch.Tensor] | None = None,
    offset: Sequence[torch.Tensor] | None = None,
    antiquant_scale: Sequence[torch.Tensor] | None = None,
    antiquant_offset: Sequence[torch.Tensor] | None = None,
    per_token_scale: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | None = None,
    activation_input: Sequence[torch.Tensor] | None = None,
    activation_quant_scale: Sequence[torch.Tensor] | None = None,
    activation_quant_offset: Sequence[torch.Tensor] | None = None,
    split_item: int | None = 0,
    group_type: int | None = -1,
    group_list_type: int | None = 0,
    act_type: int | None = 0,
    tuning_config: Sequence[int] | None = None,
    output_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """See the module docstring; returns a list of tensors as the op does."""
    quant = {name: value for name, value in locals().items() if name in QUANT_ARGS}
    _check(x, weight, bias, group_list, split_item, group_type, group_list_type, act_type, quant)
    del tuning_config  # a tiling hint of the kernel
    dtype = output_dtype or x[0].dtype
    if group_type == 0:
        w = _stacked_weight(weight)
        ends = _rows_of_groups(group_list, group_list_type, x[0].shape[0])
        y = grouped_matmul(x[0], w, ends, 0)
        if bias:
            starts = [0] + ends[:-1]
            y = y.clone()
            for e, (lo, hi) in enumerate(zip(starts, ends)):
                y[lo:hi] += bias[0][e]
        return [y.to(dtype)]
    outs = [xi @ wi + (bias[i] if bias else 0) for i, (xi, wi) in enumerate(zip(x, weight))]
    outs = [o.to(dtype) for o in outs]
    return [torch.cat(outs, dim=0)] if split_item in (2, 3) else outs


def grouped_matmul_shapes(
    x: Sequence[torch.Tensor],
    weight: Sequence[torch.Tensor],
    *,
    bias: Sequence[torch.Tensor] | None = None,
    scale: Sequence[torch.Tensor] | None = None,
    offset: Sequence[torch.Tensor] | None = None,
    antiquant_scale: Sequence[torch.Tensor] | None = None,
    antiquant_offset: Sequence[torch.Tensor] | None = None,
    per_token_scale: Sequence[torch.Tensor] | None = None,
    group_list: torch.Tensor | None = None,
    activation_input: Sequence[torch.Tensor] | None = None,
    activation_quant_scale: Sequence[torch.Tensor] | None = None,
    activation_quant_offset: Sequence[torch.Tensor] | None = None,
    split_item: int | None = 0,
    group_type: int | None = -1,
    group_list_type: int | None = 0,
    act_type: int | None = 0,
    tuning_config: Sequence[int] | None = None,
    output_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    quant = {name: value for name, value in locals().items() if name in QUANT_ARGS}
    _check(x, weight, bias, group_list, split_item, group_type, group_list_type, act_type, quant)
    dtype = output_dtype or x[0].dtype
    if group_type == 0:
        return [x[0].new_empty(x[0].shape[0], _grouped_weight_shape(weight)[2], dtype=dtype)]
    outs = [xi.new_empty(*xi.shape[:-1], wi.shape[1], dtype=dtype) for xi, wi in zip(x, weight)]
    if split_item in (2, 3):
        rows = sum(o.shape[0] for o in outs)
        return [x[0].new_empty(rows, *outs[0].shape[1:], dtype=dtype)]
    return outs
