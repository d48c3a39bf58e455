"""Truncated importance sampling (TIS) of the policy-gradient term against the rollout engine's log-probs.

The tokens were sampled by the rollout engine (A3: vllm-ascend in bf16), whose log-probs differ from the
training engine's for the same parameters (measured by bench/bench_bf16_mismatch.py; rollout_mismatch/* per
step). With the old-log-prob pass skipped, the update's PPO ratio is the actor against itself
(old = current.detach(), ratio exactly 1), so nothing in the loss sees that the samples came from another
distribution. TIS reweights each response token's policy-gradient term by

    w = min(exp(logp_train - logp_rollout), C)          (no gradient through w)

where logp_train is the training engine's log-prob of the sampled token under the parameters the rollout
used (``old_log_prob``: the current log-prob detached when the pass is skipped, the recomputed one when it
runs) and logp_rollout the rollout's (batch key ``rollout_log_probs``, at the sampling temperature). The
cap C bounds the variance a token the rollout under-sampled can add (an importance weight is unbounded
above); weights below 1 are kept as they are (they only shrink a term). The per-token loss of verl's
``compute_policy_loss`` is positively homogeneous in the advantage for w > 0 (each branch is
-A x ratio or -A x clip(ratio) or -A x clip_ratio_c, and the branch chosen depends only on the ratio and the
sign of A), so calling it with advantages A x w gives exactly w x (its per-token loss), with the same clip
fractions and KL; w = 1 (log-probs that agree) leaves every number unchanged bit for bit.

Config: ``actor_rollout_ref.actor.rollout_correction.tis_cap`` (`CAP_KEY`): C, or null for off. Metrics:
`WEIGHT_MEAN` (mean w over the response tokens) and `CAPPED_SHARE` (share of them whose weight was capped).
"""

from __future__ import annotations

from typing import Any

import torch

from verl_patches.worker_calls.rollout_correction import CAP_KEY, ROLLOUT_LOG_PROBS, cap_problem

WEIGHT_MEAN = "rollout_correction/tis_weight_mean"
CAPPED_SHARE = "rollout_correction/tis_capped_share"


class RolloutLogProbsMissing(KeyError):
    """TIS is on but the batch has no rollout log-probs to weigh against."""


def tis_cap(actor_config: Any) -> float | None:
    """C from the actor's config (``rollout_correction.tis_cap``), or None when TIS is off."""
    section = actor_config.get("rollout_correction", None) or {}
    value = section.get("tis_cap", None)
    problem = cap_problem(value)
    if problem:
        raise ValueError(problem)
    return None if value is None else float(value)


def require_rollout_log_probs(keys: Any, cap: float | None) -> None:
    """With TIS on, the batch must carry the rollout's log-probs; the error names the key and the setting."""
    if cap is not None and ROLLOUT_LOG_PROBS not in keys:
        raise RolloutLogProbsMissing(
            f"{CAP_KEY}={cap:g} needs the rollout's log-probs of the sampled tokens (batch key "
            f"{ROLLOUT_LOG_PROBS}), which this batch lacks: verl's vLLM rollout returns them; set {CAP_KEY}=null "
            "for a rollout that does not"
        )


def tis_weights(
    train_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor, cap: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """w = min(exp(train - rollout), cap) per token (1 outside the response mask, where the rollout pads with
    -1), detached, in the training log-probs' dtype; and its metrics over the response tokens."""
    if train_log_prob.shape != rollout_log_prob.shape or train_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"TIS: shapes differ: train log-probs {tuple(train_log_prob.shape)}, rollout log-probs "
            f"{tuple(rollout_log_prob.shape)}, response mask {tuple(response_mask.shape)}"
        )
    mask = response_mask.bool()
    ratio = torch.exp(train_log_prob.detach() - rollout_log_prob.detach().to(train_log_prob.dtype))
    ratio = torch.where(mask, ratio, torch.ones_like(ratio))
    bad = int(torch.isnan(ratio[mask]).sum())
    if bad:  # an infinite ratio is capped like any large one; NaN (e.g. -inf in both) has no weight to give
        raise ValueError(f"TIS: {bad} response token(s) have no importance ratio (NaN from the log-probs)")
    weights = ratio.clamp(max=cap)
    n = max(1, int(mask.sum()))
    metrics = {
        WEIGHT_MEAN: float(weights[mask].double().sum()) / n,
        CAPPED_SHARE: float((ratio[mask] > cap).double().sum()) / n,
    }
    return weights, metrics


def policy_loss(
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange: float,
    cliprange_low: float,
    cliprange_high: float,
    clip_ratio_c: float,
    loss_agg_mode: str,
    rollout_log_prob: torch.Tensor | None = None,
    cap: float | None = None,
) -> tuple[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], dict[str, float]]:
    """verl's ``compute_policy_loss`` (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), each token's term
    weighted by TIS against `rollout_log_prob` when `cap` is set (`old_log_prob` is the training engine's
    log-prob of the sampled tokens, detached); the TIS metrics ({} when off). The Megatron actor's loss."""
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.trainer.ppo.core_algos import compute_policy_loss

    metrics: dict[str, float] = {}
    if cap is not None:
        if rollout_log_prob is None:
            raise RolloutLogProbsMissing(f"{CAP_KEY}={cap:g}: no rollout log-probs given")
        weights, metrics = tis_weights(old_log_prob, rollout_log_prob, response_mask, cap)
        advantages = advantages * weights.to(advantages.dtype)
    out = compute_policy_loss(
        old_log_prob=old_log_prob,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=response_mask,
        cliprange=cliprange,
        cliprange_low=cliprange_low,
        cliprange_high=cliprange_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
    )
    return out, metrics
