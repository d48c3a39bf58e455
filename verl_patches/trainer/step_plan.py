"""What one training step of our fit loop does, decided once from the config and the environment (pure).

Three switches change the driver's dataflow (vendor items A1, A2, C2):

* ``skip_old_log_prob``: ``actor_rollout_ref.actor.recompute_old_log_prob=False``. No old-log-prob pass;
  the actor uses its own detached log-probs as the old ones, exact only on-policy (checked by
  `config_checks`).
* ``d2d``: env ``D2D_DATA_TRANSFER`` (vendor name; off by default). Rollout tensors stay on the workers
  (verl_patches.reshard.tensor_cache); the driver sends ref a tensor-less batch and update_actor only
  ``advantages``.
* ``fused_role``: ``overlay.fused_actor_rollout_ref`` (default False where the key is absent). One
  worker group plays actor, rollout and reference on one resource pool (role ``actor_rollout_ref``).

Workers read the same environment variable, so it must reach them (Ray runtime env) unchanged.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from verl_patches.trainer.config_checks import get

D2D_ENV = "D2D_DATA_TRANSFER"
FUSED_ROLE_KEY = "overlay.fused_actor_rollout_ref"
RECOMPUTE_KEY = "actor_rollout_ref.actor.recompute_old_log_prob"
_OFF = ("", "0", "false", "no", "off")


def d2d_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """`D2D_DATA_TRANSFER` set to anything but 0/false/no/off/empty (the vendor's reading: `!= 0`)."""
    raw = (os.environ if environ is None else environ).get(D2D_ENV)
    return raw is not None and raw.strip().lower() not in _OFF


@dataclass(frozen=True)
class StepPlan:
    skip_old_log_prob: bool
    d2d: bool
    fused_role: bool

    def describe(self) -> str:
        return (f"old-log-prob pass {'skipped' if self.skip_old_log_prob else 'computed'}, "
                f"D2D tensor cache {'on' if self.d2d else 'off'}, "
                f"actor/rollout/ref {'fused in one worker group' if self.fused_role else 'as upstream'}")


def plan_steps(cfg: Any, environ: Mapping[str, str] | None = None) -> StepPlan:
    """The plan for `cfg`; consistency is `config_checks.check_config`'s job, not this function's."""
    return StepPlan(skip_old_log_prob=get(cfg, RECOMPUTE_KEY, True) is False,
                    d2d=d2d_enabled(environ),
                    fused_role=bool(get(cfg, FUSED_ROLE_KEY, False)))
