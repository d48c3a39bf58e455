"""Which weight-sync path is active (standard library only, so the audit can report it without torch).

``NO_ALL_TO_ALL_RESHARD=1`` keeps the vendor's all-gather path (PP broadcast of every parameter, experts
all-gathered over the training TP×EP group) for comparison; anything else runs the all-to-all path
(lockstep PP exchange, experts routed straight to the rollout rank that serves them).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from verl_patches.base import env_registry

ENV_FLAG = "NO_ALL_TO_ALL_RESHARD"
ALL_TO_ALL = "all-to-all"
ALL_GATHER = "all-gather"


def active_sync_path(environ: Mapping[str, str] | None = None) -> str:
    """``"all-to-all"`` or ``"all-gather"``; an unrecognised flag value is an error naming it (`EnvError`)."""
    return ALL_GATHER if env_registry.flag(ENV_FLAG, environ) else ALL_TO_ALL


def describe_sync_path(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The audit's record: the path, the flag's value and what the path does."""
    env = os.environ if environ is None else environ
    try:
        path = active_sync_path(env)
    except ValueError as err:
        return {"path": "invalid", "flag": f"{ENV_FLAG}={env.get(ENV_FLAG)!r}", "detail": str(err)}
    detail = (
        "lockstep PP all-gather of aligned parameters, PP broadcast of the rest, experts routed by "
        "all-to-all-v to the rollout rank that serves them (vendor items E2, E3)"
        if path == ALL_TO_ALL
        else "vendor fallback: PP broadcast of every parameter, experts all-gathered over training TP×EP"
    )
    shown = f"{ENV_FLAG}={env[ENV_FLAG]}" if ENV_FLAG in env else f"{ENV_FLAG} unset"
    return {"path": path, "flag": shown, "detail": detail}
