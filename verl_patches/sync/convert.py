"""Tensor conversions of the weight sync: TP shards → one Megatron tensor → the HF tensors vLLM loads (C4, G10).

`merge_tp` undoes the TP split of `verl_patches.weights.tensor_layout` for one parameter (gate_up shards are
``[gate_t; up_t]`` per rank, so the merge is ``[gate_0..gate_T; up_0..up_T]``, not a plain concatenation).
`to_hf` splits a merged Megatron tensor into the HF tensors it stands for: MLA's fused ``linear_qkv`` into
``q_a_proj`` and ``kv_a_proj_with_mqa``, ``linear_fc1`` into ``gate_proj`` and ``up_proj``; every other
tensor maps one to one. Splits are views: vLLM's loader copies into its own parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def merge_tp(kind: str, parts: Sequence[torch.Tensor]) -> torch.Tensor:
    """One Megatron tensor from its TP shards, in TP-rank order."""
    if len(parts) == 1:
        return parts[0]
    if kind == "tp_rows":
        return torch.cat(list(parts), dim=0)
    if kind == "tp_cols":
        return torch.cat(list(parts), dim=1)
    if kind == "gate_up":
        halves = [p.chunk(2, dim=0) for p in parts]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"layout kind {kind!r} is not split over TP")


def split_sizes(kind: str, full: torch.Tensor, cfg: Mapping[str, Any]) -> list[int] | None:
    """Row sizes of the HF tensors inside a merged Megatron tensor (None: one tensor)."""
    if kind == "concat_rows":
        return [int(cfg["q_lora_rank"]), int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])]
    if kind == "gate_up":
        return [full.shape[0] // 2, full.shape[0] // 2]
    return None


def to_hf(
    kind: str, full: torch.Tensor, hf_names: Sequence[str], cfg: Mapping[str, Any]
) -> list[tuple[str, torch.Tensor]]:
    """``(hf_name, tensor)`` pairs of one merged Megatron tensor."""
    sizes = split_sizes(kind, full, cfg)
    if sizes is None:
        if len(hf_names) != 1:
            raise ValueError(f"a {kind} tensor maps to one HF name, got {list(hf_names)}")
        return [(hf_names[0], full)]
    if len(hf_names) != len(sizes) or sum(sizes) != full.shape[0]:
        raise ValueError(
            f"a {kind} tensor of shape {tuple(full.shape)} cannot be split into {list(hf_names)} with row sizes {sizes}"
        )
    return list(zip(hf_names, torch.split(full, sizes, dim=0)))
