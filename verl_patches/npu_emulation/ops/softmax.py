"""torch_npu.npu_scaled_masked_softmax (MindSpeed's fused softmax)."""

from __future__ import annotations

import torch


def npu_scaled_masked_softmax(
    x: torch.Tensor, mask: torch.Tensor | None, scale: float = 1.0, fixed_triu_mask: bool = False
) -> torch.Tensor:
    """softmax(x * scale with masked positions at -10000) over the last dim, in x's dtype
    (Megatron's FusedScaleMaskSoftmax convention: True = masked)."""
    xf = x.float() * scale
    if fixed_triu_mask:
        sq, sk = x.shape[-2], x.shape[-1]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=x.device).triu(1)
    if mask is not None:
        xf = xf.masked_fill(mask.to(torch.bool), -10000.0)
    return torch.softmax(xf, dim=-1).to(x.dtype)
