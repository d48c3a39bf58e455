"""MoE token permutation: MindSpeed's npu_moe_token_permute / npu_moe_token_unpermute builder ops."""

from __future__ import annotations

import torch


def npu_moe_token_permute(
    tokens: torch.Tensor, indices: torch.Tensor, num_out_tokens: int | None = None, padded_mode: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group token copies by expert: sorted_indices is the stable argsort of the flattened expert ids
    [T*topk]; row r of the output is tokens[sorted_indices[r] // topk]. num_out_tokens (> 0) keeps
    only the first that many rows (capacity dropping)."""
    if padded_mode:
        raise NotImplementedError(
            "npu_moe_token_permute on CPU: padded_mode is not emulated (the A3 profile is dropless)"
        )
    topk = indices.size(1) if indices.dim() > 1 else 1
    flat = indices.reshape(-1)
    sorted_indices = torch.argsort(flat, stable=True)
    if num_out_tokens is not None and num_out_tokens > 0:
        sorted_indices = sorted_indices[:num_out_tokens]
    permuted = tokens.index_select(0, torch.div(sorted_indices, topk, rounding_mode="floor"))
    return permuted, sorted_indices.to(torch.int32)


def npu_moe_token_unpermute(
    permuted_tokens: torch.Tensor,
    sorted_indices: torch.Tensor,
    probs: torch.Tensor | None = None,
    padded_mode: bool = False,
    restore_shape: torch.Size | None = None,
) -> torch.Tensor:
    """Inverse of npu_moe_token_permute: scatter rows back to their (token, k) slot, weight each by
    probs[token, k] (if given) and sum the topk copies of each token."""
    if padded_mode:
        raise NotImplementedError("npu_moe_token_unpermute on CPU: padded_mode is not emulated")
    topk = probs.size(1) if probs is not None else 1
    slots = probs.numel() if probs is not None else permuted_tokens.size(0)
    hidden = permuted_tokens.shape[-1]
    idx = sorted_indices.to(torch.int64)
    full = permuted_tokens.new_zeros((slots, hidden)).index_copy(0, idx, permuted_tokens)
    full = full.view(-1, topk, hidden)
    if probs is not None:
        full = full * probs.to(permuted_tokens.dtype).unsqueeze(-1)
    return full.sum(dim=1)
