"""How far the rollout engine's log-probs of the sampled tokens are from the training engine's.

Both must be at the sampling temperature (logits / T, then log-softmax) and over the same tokens. With
Δ = train − rollout per response token:

* ``rollout_mismatch/logprob_abs_diff_mean`` = mean |Δ|
* ``rollout_mismatch/ratio_abs_dev_mean``    = mean |exp(Δ) − 1| (how far the importance ratio the
  update assumes to be 1 is from 1)
* ``rollout_mismatch/logprob_abs_diff_max``  = max |Δ|
* ``rollout_mismatch/tokens``                = number of response tokens compared

Batch keys (shape [batch, response_length], float, padding anywhere the response mask is 0):

* ``rollout_log_probs``: the rollout's log-probs of the sampled tokens, returned by generate_sequences
  (verl v0.4.0's vLLM rollout already returns this key; the rollout stand-in must too);
* the training engine's log-probs of the same tokens: ``old_log_probs`` when the old-log-prob pass runs.
  When it is skipped the actor computes them anyway in its forward of update_actor (with the parameters
  the rollout used: one mini-batch per step), so the actor worker reports these metric names in
  ``update_actor``'s ``meta_info["metrics"]``, computed with `mismatch_metrics` on its micro-batches.

The math is in float64 so that the metric measures the engines, not this function.
"""

from __future__ import annotations

from typing import Any

import torch

PREFIX = "rollout_mismatch/"
ABS_DIFF = PREFIX + "logprob_abs_diff_mean"
RATIO_DEV = PREFIX + "ratio_abs_dev_mean"
ABS_DIFF_MAX = PREFIX + "logprob_abs_diff_max"
TOKENS = PREFIX + "tokens"
METRIC_NAMES = (ABS_DIFF, RATIO_DEV, ABS_DIFF_MAX, TOKENS)
ROLLOUT_KEY = "rollout_log_probs"
TRAIN_KEY = "old_log_probs"


def mismatch_metrics(
    rollout_log_probs: torch.Tensor, train_log_probs: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """The metrics above over the tokens where `response_mask` is non-zero."""
    if rollout_log_probs.shape != train_log_probs.shape or train_log_probs.shape != response_mask.shape:
        raise ValueError(
            f"log-prob mismatch: shapes differ: rollout {tuple(rollout_log_probs.shape)}, "
            f"train {tuple(train_log_probs.shape)}, response mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    n = int(mask.sum())
    if n == 0:
        raise ValueError("log-prob mismatch: the response mask selects no token")
    delta = (train_log_probs.detach().double() - rollout_log_probs.detach().double())[mask]
    if not bool(torch.isfinite(delta).all()):
        raise ValueError(
            f"log-prob mismatch: {int((~torch.isfinite(delta)).sum())} of {n} response tokens have a "
            f"non-finite log-prob (rollout or train)"
        )
    abs_delta = delta.abs()
    return {
        ABS_DIFF: float(abs_delta.mean()),
        RATIO_DEV: float(torch.expm1(delta).abs().mean()),
        ABS_DIFF_MAX: float(abs_delta.max()),
        TOKENS: float(n),
    }


def batch_mismatch_metrics(batch: Any) -> dict[str, float]:
    """From a verl DataProto holding both keys and ``response_mask`` (or ``attention_mask`` and
    ``responses``); {} when either log-prob key is absent."""
    tensors = batch.batch
    keys = set(tensors.keys())
    if ROLLOUT_KEY not in keys or TRAIN_KEY not in keys:
        return {}
    if "response_mask" in keys:
        mask = tensors["response_mask"]
    else:
        mask = tensors["attention_mask"][:, -tensors["responses"].shape[-1] :]
    return mismatch_metrics(tensors[ROLLOUT_KEY], tensors[TRAIN_KEY], mask)
