"""Step metrics under the names of the vendor's step table, so runs compare with its published numbers.

verl reports `perf/throughput` per worker (one worker = one NPU die). The vendor's headline figures
are per A3 card (two dies): 123.16 system tokens/s/card with real weights = all tokens of a step /
step time / 128 cards. We add both, plus inference (response tokens / generation time) and training
(all tokens / update time) throughput, and the train->rollout switch measured on the workers. The dies per
card come from VERL_PATCHES_DIES_PER_CARD, which the trainer entry sets from ``overlay.dies_per_card``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base import env_registry
from verl_patches.worker_calls.env_names import DIES_PER_CARD_ENV
from verl_patches.worker_calls.meta_keys import TIMING_META_KEY


def reference_step_metrics(
    timing_raw: dict[str, float],
    total_tokens: float,
    response_tokens: float,
    n_dies: int,
    dies_per_card: int,
    switch: dict[str, float],
) -> dict[str, float]:
    """Pure: the extra metrics from verl's timings and token counts."""
    cards = max(n_dies / dies_per_card, 1e-9)
    out: dict[str, float] = {}
    step, gen, update = timing_raw.get("step"), timing_raw.get("gen"), timing_raw.get("update_actor")
    if "reshard" in switch:
        out["timing_s/reshard"] = switch["reshard"]
        if gen is not None:
            out["timing_s/rollout"] = max(gen - switch["reshard"], 0.0)
    if step:
        out["perf/system_tokens_per_s_per_die"] = total_tokens / step / n_dies
        out["perf/system_tokens_per_s_per_card"] = total_tokens / step / cards
    rollout = out.get("timing_s/rollout", gen)  # the vendor's "rollout" excludes the weight switch
    if rollout:
        out["perf/inference_tokens_per_s_per_card"] = response_tokens / rollout / cards
    if update:
        out["perf/training_tokens_per_s_per_card"] = total_tokens / update / cards
    return out


def with_reference_metrics(compute: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    @functools.wraps(compute)
    def compute_throughout_metrics(batch: Any, timing_raw: dict[str, float], n_gpus: int) -> dict[str, Any]:
        metrics = compute(batch, timing_raw, n_gpus)
        total = float(sum(batch.meta_info.get("global_token_num", [0])))
        try:
            response = float(batch.batch["attention_mask"][:, -batch.batch["responses"].shape[-1] :].sum())
        except (KeyError, TypeError, AttributeError):
            response = 0.0
        dies_per_card = env_registry.integer(DIES_PER_CARD_ENV)  # 1 when unset; at least 1
        metrics.update(
            reference_step_metrics(
                timing_raw, total, response, n_gpus, dies_per_card, batch.meta_info.get(TIMING_META_KEY, {})
            )
        )
        return metrics

    return compute_throughout_metrics
