"""torch_npu.npu_top_k_top_p: the top-k then top-p (nucleus) filter vllm-ascend's sampler calls
(VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE=1, both k and p given), in plain torch."""

from __future__ import annotations

import torch


def npu_top_k_top_p(logits: torch.Tensor, p: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """Per row b of logits [B, V]: logits below the k[b]-th largest become -inf (ties with it stay); then, over
    the softmax of what is left sorted ascending, every logit whose cumulative probability is <= 1 - p[b] becomes
    -inf, the largest always staying. Returns a new tensor in logits' dtype and order. (k's dtype and range, p's
    dtype: the documented limits, checked before the kernel runs: wheel_contract/limits.py.)"""
    if logits.dim() != 2:
        raise ValueError(f"npu_top_k_top_p: logits must be [batch, vocab], got {tuple(logits.shape)}")
    batch, vocab = logits.shape
    if tuple(p.shape) != (batch,) or tuple(k.shape) != (batch,):
        raise ValueError(
            f"npu_top_k_top_p: p {tuple(p.shape)} and k {tuple(k.shape)} must both be ({batch},); note the order "
            "(logits, p, k)"
        )
    sorted_logits, order = logits.sort(dim=-1, descending=False, stable=True)
    kth_largest = sorted_logits.gather(-1, (vocab - k.long()).unsqueeze(-1))
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth_largest, float("-inf"))
    probs = sorted_logits.float().softmax(dim=-1)
    outside_p = probs.cumsum(dim=-1) <= 1 - p.float().unsqueeze(-1)
    outside_p[:, -1] = False
    sorted_logits = sorted_logits.masked_fill(outside_p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
