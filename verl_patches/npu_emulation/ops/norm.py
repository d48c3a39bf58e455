"""torch_npu.npu_rms_norm: RMSNorm returning (y, rstd)."""

from __future__ import annotations

import torch


def npu_rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rsqrt(mean(x^2 over the dims gamma spans) + eps) * gamma, computed in fp32 like the
    kernel; rstd keeps x's leading dims and 1 for each normalised dim."""
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    rstd = torch.rsqrt(xf.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    y = (xf * rstd * gamma.to(xf.dtype)).to(x.dtype)
    return y, rstd
