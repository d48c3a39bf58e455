"""What each training rank holds, per parameter, and what the rollout must be handed (pure, no collectives).

The training side is MindSpeed-LLM's DeepSeek-V3 GPTModel at a TP/PP/EP layout with grouped GEMM and
TP-extend-EP: exactly the per-rank state dicts `verl_patches.weights.hf_to_mcore` builds. Shapes are derived
from ``config.json`` with meta tensors (nothing is read), so every rank computes the same table.

A `SyncParam` is one non-expert Megatron tensor of one pipeline stage: its local and global names, the
layout kind of `verl_patches.weights.names` (how TP splits it), its per-rank and TP-merged ("full") shapes,
and the Hugging Face names vLLM's DeepSeek loader accepts for it. Routed experts (``mlp.experts.weight1/2``)
are not listed here; they take the expert reshard (`verl_patches.reshard.ep_plan`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

import torch

from verl_patches.reshard.pp_plan import global_name, layer_offsets
from verl_patches.weights.hf_to_mcore import meta_source, plan_rank_shapes
from verl_patches.weights.layout import ParallelLayout, Rank
from verl_patches.weights.names import GLOBAL_POST, GLOBAL_PRE, layer_rule_for, mcore_to_hf_names, split_layer_name

TP_SPLIT_KINDS = ("tp_rows", "tp_cols", "gate_up")
EXPERT_KINDS = ("grouped_w1", "grouped_w2")
_GLOBAL_KIND = {r.mcore: r.kind for r in GLOBAL_PRE + GLOBAL_POST}


@dataclass(frozen=True)
class SyncParam:
    stage: int
    local_name: str
    global_name: str
    kind: str
    local_shape: tuple[int, ...]
    full_shape: tuple[int, ...]
    dtype: torch.dtype
    hf_names: tuple[str, ...]

    @property
    def is_tp_split(self) -> bool:
        return self.kind in TP_SPLIT_KINDS

    @property
    def full_bytes(self) -> int:
        return prod(self.full_shape) * self.dtype.itemsize

    @property
    def local_bytes(self) -> int:
        return prod(self.local_shape) * self.dtype.itemsize


def kind_of(local_name: str) -> str:
    """Layout kind of a Megatron parameter name (see `verl_patches.weights.tensor_layout`)."""
    if local_name in _GLOBAL_KIND:
        return _GLOBAL_KIND[local_name]
    split = split_layer_name(local_name)
    if split is None:
        raise KeyError(f"{local_name!r} is not a MindSpeed-LLM DeepSeek-V3 parameter name")
    return layer_rule_for(split[1])[0].kind


def full_shape(kind: str, local_shape: tuple[int, ...], tp: int) -> tuple[int, ...]:
    """Shape after merging the ``tp`` shards (Megatron orientation; gate_up = [gate; up])."""
    if kind in ("tp_rows", "gate_up"):
        return (local_shape[0] * tp, *local_shape[1:])
    if kind == "tp_cols":
        return (local_shape[0], local_shape[1] * tp)
    return tuple(local_shape)


def weights_layout(tp: int, pp: int, ep: int, num_layer_list: tuple[int, ...] | None) -> ParallelLayout:
    """The checkpoint layout the training run uses: grouped GEMM with TP-extend-EP (the A3 profile)."""
    return ParallelLayout(
        tp=tp,
        pp=pp,
        ep=ep,
        num_layer_list=tuple(num_layer_list) if num_layer_list else None,
        moe_grouped_gemm=True,
        moe_tp_extend_ep=True,
    )


def stage_tables(
    cfg: Mapping[str, Any], layout: ParallelLayout, dtype: torch.dtype = torch.bfloat16
) -> tuple[tuple[SyncParam, ...], ...]:
    """Per pipeline stage, its non-expert parameters in Megatron's order."""
    meta = meta_source(cfg, dtype)
    counts = layout.num_layer_list or (cfg["num_hidden_layers"] // layout.pp,) * layout.pp
    offsets = layer_offsets(counts)
    out = []
    for stage in range(layout.pp):
        shapes = plan_rank_shapes(cfg, layout, Rank(0, stage, 0), meta)
        params = []
        for name, (shape, dtype) in shapes.items():
            kind = kind_of(name)
            if kind in EXPERT_KINDS:
                continue
            gname = global_name(name, offsets[stage])
            params.append(
                SyncParam(
                    stage,
                    name,
                    gname,
                    kind,
                    tuple(shape),
                    full_shape(kind, tuple(shape), layout.tp),
                    dtype,
                    tuple(mcore_to_hf_names(gname)),
                )
            )
        out.append(tuple(params))
    return tuple(out)


def moe_layers(cfg: Mapping[str, Any], counts: tuple[int, ...]) -> tuple[tuple[int, int, int], ...]:
    """``(global_layer, stage, local_layer)`` of every MoE layer, in global order."""
    out = []
    for stage, (start, n) in enumerate(zip(layer_offsets(counts), counts)):
        for local in range(n):
            if start + local >= cfg["first_k_dense_replace"]:
                out.append((start + local, stage, local))
    return tuple(out)
