"""What one training step of our fit loop does, decided once from the config and the environment (pure).

Three switches change the driver's dataflow (vendor items A1, A2, C2):

* ``skip_old_log_prob``: ``actor_rollout_ref.actor.recompute_old_log_prob=False``. No old-log-prob pass;
  the actor uses its own detached log-probs as the old ones, exact only on-policy (checked by
  `config_checks`).
* ``d2d``: ``overlay.d2d_tensor_cache`` (True in ppo_mindspeed_trainer.yaml; False where the key is
  absent), overridden by the vendor's env ``D2D_DATA_TRANSFER`` when that is set: the environment wins,
  ``D2D_DATA_TRANSFER=0`` turns the cache off for a config that has it on, ``=1`` on for one that has it
  off. Rollout tensors stay on the workers (verl_patches.reshard.tensor_cache); the driver sends ref a
  tensor-less batch and update_actor only ``advantages``.
* ``fused_role``: ``overlay.fused_actor_rollout_ref`` (default False where the key is absent). One
  worker group plays actor, rollout and reference on one resource pool (role ``actor_rollout_ref``).

The workers read neither the key nor the variable: the fit loop tells them per call
(`step_payloads.D2D_META_KEY` in ``meta_info``), so driver and workers cannot disagree.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_patches.base import env_registry
from verl_patches.base.config_access import get
from verl_patches.base.overlay_settings import overlay_settings

D2D_ENV = "D2D_DATA_TRANSFER"
D2D_KEY = "overlay.d2d_tensor_cache"  # named in the lines; read through overlay_settings
FUSED_ROLE_KEY = "overlay.fused_actor_rollout_ref"
RECOMPUTE_KEY = "actor_rollout_ref.actor.recompute_old_log_prob"


def d2d_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`D2D_DATA_TRANSFER` as a switch (`verl_patches.base.env_flags`: 1/true/yes/on, 0/false/no/off/empty;
    anything else is an error naming it); off when unset."""
    return env_registry.flag(D2D_ENV, environ)


def d2d_setting(cfg: Any, environ: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """(on, what decided it): `D2D_DATA_TRANSFER` when set (it wins), else ``overlay.d2d_tensor_cache``."""
    env = os.environ if environ is None else environ
    if D2D_ENV in env:
        return d2d_enabled(env), f"{D2D_ENV}={env[D2D_ENV]!r}"
    on = overlay_settings(cfg).d2d_tensor_cache
    return on, f"{D2D_KEY}={on}"


@dataclass(frozen=True)
class StepPlan:
    skip_old_log_prob: bool
    d2d: bool
    fused_role: bool

    def describe(self) -> str:
        return (
            f"old-log-prob pass {'skipped' if self.skip_old_log_prob else 'computed'}, "
            f"D2D tensor cache {'on' if self.d2d else 'off'}, "
            f"actor/rollout/ref {'fused in one worker group' if self.fused_role else 'as upstream'}"
        )


def plan_steps(cfg: Any, environ: Mapping[str, str] | None = None) -> StepPlan:
    """The plan for `cfg`; consistency is `config_checks.check_config`'s job, not this function's."""
    return StepPlan(
        skip_old_log_prob=get(cfg, RECOMPUTE_KEY, True) is False,
        d2d=d2d_setting(cfg, environ)[0],
        fused_role=overlay_settings(cfg).fused_actor_rollout_ref,
    )
