"""``RayPPOTrainer.init_workers`` and ``RayPPOTrainer.fit`` handed to the driver (`verl_patches.driver`).

The declarations (vendor items A1 and A2) wrap upstream's methods with these; what runs in their place is the
driver's: the fused actor/rollout/ref role (`driver.fused_role`) and the step plan's fit loop
(`driver.fit_loop`). Upstream's own method runs where the driver has nothing to add: the fused role switched
off, and REMAX (a second greedy generation per step), which keeps upstream's fit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.driver.config_checks import raise_on_problems
from verl_patches.driver.fit_loop import run_fit
from verl_patches.driver.fused_role import init_fused_workers
from verl_patches.driver.step_plan import plan_steps

REMAX = ("remax", "AdvantageEstimator.REMAX")


def with_fused_role(init_workers: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``init_workers`` that builds one actor/rollout/ref worker group when ``overlay.fused_actor_rollout_ref``."""

    @functools.wraps(init_workers)
    def overlay_init_workers(self: Any) -> Any:
        if not overlay_settings(self.config).fused_actor_rollout_ref:
            return init_workers(self)
        return init_fused_workers(self)

    return overlay_init_workers


def with_overlay_fit(fit: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fit`` that checks the config again and runs the driver's fit loop with its step plan."""

    @functools.wraps(fit)
    def overlay_fit(self: Any) -> Any:
        # Again here, in the process that drives the workers: verl's own entry points skip our entry's check.
        raise_on_problems(self.config)
        if str(self.config.algorithm.adv_estimator) in REMAX:
            return fit(self)
        return run_fit(self, plan_steps(self.config))

    return overlay_fit
