"""Rotary position embedding: torch_npu.npu_rotary_mul and MindSpeed's npu_rotary_position_embedding."""

from __future__ import annotations

import torch

ROTATE_HALF = 0  # mode 0: pairs are (x[i], x[i + d/2])
INTERLEAVED = 1  # mode 1: pairs are (x[2i], x[2i + 1])


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleaved(x: torch.Tensor) -> torch.Tensor:
    x1 = x[..., 0::2]
    x2 = x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def npu_rotary_position_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mode: int = 0) -> torch.Tensor:
    """x * cos + rotate(x) * sin, with rotate the half rotation (mode 0) or the pairwise one (mode 1)."""
    if mode == ROTATE_HALF:
        return x * cos + _rotate_half(x) * sin
    if mode == INTERLEAVED:
        return x * cos + _rotate_interleaved(x) * sin
    raise ValueError(f"npu_rotary_position_embedding: mode must be 0 (rotate half) or 1 (interleaved), got {mode!r}")


def npu_rotary_mul(x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, rotary_mode: str = "half") -> torch.Tensor:
    """torch_npu.npu_rotary_mul: x * r1 + rotate_half(x) * r2 ('half'), or the interleaved pairing."""
    mode = {"half": ROTATE_HALF, "interleave": INTERLEAVED}.get(rotary_mode)
    if mode is None:
        raise ValueError(f"npu_rotary_mul: rotary_mode must be 'half' or 'interleave', got {rotary_mode!r}")
    return npu_rotary_position_embedding(x, r1, r2, mode)
