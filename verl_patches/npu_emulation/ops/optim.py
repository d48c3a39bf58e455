"""torch_npu.npu_apply_adam_w: one in-place AdamW step."""

from __future__ import annotations

import torch


def npu_apply_adam_w(
    beta1_power: float,
    beta2_power: float,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
    eps: float,
    grad: torch.Tensor,
    max_grad_norm: torch.Tensor | None,
    amsgrad: bool,
    maximize: bool,
    out: tuple,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """AdamW on out=(param, exp_avg, exp_avg_sq), in place; beta*_power are beta^(t-1) as MindSpeed's
    AdamW passes them, so the bias corrections are 1 - beta^t (torch.optim.AdamW's step t)."""
    if amsgrad:
        raise NotImplementedError("npu_apply_adam_w on CPU: amsgrad needs max_exp_avg_sq, which the op does not take")
    param, exp_avg, exp_avg_sq = out
    g = -grad if maximize else grad
    if max_grad_norm is not None:
        raise NotImplementedError("npu_apply_adam_w on CPU: max_grad_norm clipping inside the op is not emulated")
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    bc1 = 1 - beta1_power * beta1
    bc2 = 1 - beta2_power * beta2
    denom = (exp_avg_sq.sqrt() / (bc2**0.5)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bc1)
    return param, exp_avg, exp_avg_sq


def npu_apply_fused_adamw_v2(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    max_exp_avg_sq: torch.Tensor,
    state_step,
    lr: float,
    beta1: float,
    beta2: float,
    weight_decay: float,
    eps: float,
    amsgrad: bool,
    maximize: bool,
) -> None:
    """MindSpeed's builder op (swap optimizer): torch.optim.AdamW's step t = state_step, in place."""
    t = int(state_step.item() if isinstance(state_step, torch.Tensor) else state_step)
    g = (-grad if maximize else grad).to(param.dtype)
    param.mul_(1 - lr * weight_decay)
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    second = exp_avg_sq
    if amsgrad:
        torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        second = max_exp_avg_sq
    bc1, bc2 = 1 - beta1**t, 1 - beta2**t
    denom = (second.sqrt() / (bc2**0.5)).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-lr / bc1)
