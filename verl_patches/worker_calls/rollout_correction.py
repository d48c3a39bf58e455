"""TIS's contract between the config, the driver and the actor: the cap's key and its rule, and the batch key
of the rollout's log-probs the actor weighs against.

The driver's config checks (`verl_patches.driver.config_checks`) refuse a bad cap before the job starts; the
actor (`verl_patches.patches.verl.workers.actor.rollout_correction`) reads the same key with the same rule.
Standard library only: the checks run where torch is not loaded.
"""

from __future__ import annotations

import math
from typing import Any

CAP_KEY = "actor_rollout_ref.actor.rollout_correction.tis_cap"
ROLLOUT_LOG_PROBS = "rollout_log_probs"


def cap_problem(value: Any) -> str | None:
    """Why `value` is not a valid `CAP_KEY` (None when it is: null, or a finite number >= 1)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{CAP_KEY}={value!r} must be a number >= 1 (the largest importance weight) or null (off)"
    if not (math.isfinite(value) and value >= 1):
        return (
            f"{CAP_KEY}={value!r} must be a finite number >= 1: a cap below 1 would shrink the terms of tokens "
            "both engines agree on (weight exactly 1)"
        )
    return None
