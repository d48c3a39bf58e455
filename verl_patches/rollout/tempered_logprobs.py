"""The rollout reports each sampled token's log-prob at the sampling temperature.

vLLM 0.9.1's V1 sampler (the engine vllm-ascend runs, ``VLLM_USE_V1=1``) reports log-probs of the raw
logits, before temperature. The training engine scores the same tokens at the sampling temperature (C3:
logits / T), so at the A3 profile's T=0.9 the per-step rollout/train mismatch metric would compare two
different distributions and never be small. Here the sampled token's log-prob (and the top-k the request
asked for) comes from ``log_softmax(logits / T)`` per request, before top-k/top-p truncation, which is the
distribution the actor computes. Greedy requests (T below vLLM's epsilon) keep the raw log-probs. Which
token is sampled does not change: sampling runs unchanged on the original logits.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import torch

SAMPLING_EPS = 1e-5  # vLLM's threshold below which a request is greedy


def effective_temperatures(temperature: torch.Tensor | None, num_rows: int, device: torch.device) -> torch.Tensor:
    """Per-row divisor of the logits: the request's temperature, or 1 for greedy rows (and when none is set)."""
    if temperature is None:
        return torch.ones(num_rows, dtype=torch.float32, device=device)
    t = temperature.to(device=device, dtype=torch.float32)
    return torch.where(t < SAMPLING_EPS, torch.ones_like(t), t)


def tempered_logprobs(logits: torch.Tensor, temperature: torch.Tensor | None) -> torch.Tensor:
    """``log_softmax(logits / T)`` per row in float32, out of place (the sampler reuses `logits`)."""
    t = effective_temperatures(temperature, logits.shape[0], logits.device)
    return torch.log_softmax(logits.to(torch.float32) / t.unsqueeze(1), dim=-1)


def wrap_sampler_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM V1 ``Sampler.forward`` whose log-probs are at each request's sampling temperature."""

    @functools.wraps(original)
    def forward(self: Any, logits: torch.Tensor, sampling_metadata: Any) -> Any:
        num_logprobs = sampling_metadata.max_num_logprobs
        if num_logprobs is None:
            return original(self, logits, sampling_metadata)
        logprobs = tempered_logprobs(logits, sampling_metadata.temperature)
        out = original(self, logits, dataclasses.replace(sampling_metadata, max_num_logprobs=None))
        sampled = out.sampled_token_ids.reshape(-1).long()
        out.logprobs_tensors = self.gather_logprobs(logprobs, num_logprobs, token_ids=sampled)
        return out

    return forward
