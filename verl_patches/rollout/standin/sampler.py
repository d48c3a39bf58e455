"""Sampling with vLLM's SamplingParams semantics, as verl's rollout uses them.

temperature 0 -> greedy; otherwise logits / temperature, then top-k (-1 or 0 = all), then top-p (the
smallest set whose probability reaches top_p, always keeping the most likely token), then a draw. The
log-probability reported for a sampled token is from ``log_softmax(logits / temperature)`` before top-k/top-p
truncation (raw logits for greedy): what the real rollout reports with our declared vLLM sampler patch
(verl_patches.rollout.tempered_logprobs), and the distribution the actor scores.
"""

from __future__ import annotations

import torch


def sample(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, V] -> (tokens [B], log-probs of those tokens at the sampling temperature [B])."""
    logits = logits.float()
    greedy = temperature < 1e-5
    reported = torch.log_softmax(logits if greedy else logits / temperature, dim=-1)
    if greedy:
        tokens = logits.argmax(dim=-1)
    else:
        scaled = logits / temperature
        if top_k is not None and 0 < top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if top_p is not None and top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            before = torch.cumsum(probs, dim=-1) - probs  # mass strictly above each token
            drop = before >= top_p
            drop[..., 0] = False
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)
        probs = torch.softmax(scaled, dim=-1)
        tokens = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    return tokens, reported.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
