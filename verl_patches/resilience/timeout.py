"""The one time-out of hang diagnosis, and the intervals derived from it (pure).

`VERL_PATCHES_COLLECTIVE_TIMEOUT_S` (seconds; unset or 0 = diagnosis off): a worker call whose outstanding
ranks all made no progress for this long is a hang. The A3 launcher sets it to 90% of `HCCL_EXEC_TIMEOUT`
(`verl_patches.launch.job_env`), so the report comes before HCCL's own time-out ends the job; a user or a
check shortens it for a local run.
"""

from __future__ import annotations

from collections.abc import Mapping

from verl_patches.base import env_registry

TIMEOUT_ENV = "VERL_PATCHES_COLLECTIVE_TIMEOUT_S"


def configured_timeout(environ: Mapping[str, str] | None = None) -> float:
    """The time-out in seconds (0 = off); a bad value is one line naming the variable (`EnvError`)."""
    return env_registry.number(TIMEOUT_ENV, environ)  # 0 when unset; at least 0


def publish_interval(timeout_s: float) -> float:
    """How often a worker publishes its heartbeat and the driver looks at it: 20 looks per time-out,
    between 0.2 s (a short local check) and 5 s (a cluster's 540 s: 256 ranks put once per 5 s)."""
    return max(0.2, min(5.0, timeout_s / 20))


def stale_after(timeout_s: float) -> float:
    """A heartbeat unchanged for this long means the process is frozen or dead. Only the wording of the
    report depends on it (the hang decision is the time-out's): several intervals, so that a side thread
    held off by a loaded host or a long GIL-holding call is not called frozen."""
    return max(2.0, 5 * publish_interval(timeout_s))
