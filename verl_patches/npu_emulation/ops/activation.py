"""torch_npu.npu_swiglu and its backward."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def npu_swiglu(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """silu(a) * b with a, b the two halves of x along dim."""
    a, b = torch.chunk(x, 2, dim=dim)
    return F.silu(a) * b


def npu_swiglu_backward(grad: torch.Tensor, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """d(silu(a)*b)/dx: [g*b*s*(1 + a*(1-s)), g*silu(a)] concatenated along dim, s = sigmoid(a)."""
    a, b = torch.chunk(x, 2, dim=dim)
    s = torch.sigmoid(a)
    da = grad * b * s * (1 + a * (1 - s))
    db = grad * a * s
    return torch.cat([da, db], dim=dim)
