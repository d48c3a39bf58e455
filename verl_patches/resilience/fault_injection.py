"""Fault injection for the hang and restart tests: one rank stops itself (SIGSTOP), as a host stuck in I/O, a
swapped-out or paused process would, or kills itself (SIGKILL), as the OOM killer or a lost process would, when it
enters a given phase of a given step.

`VERL_PATCHES_INJECT_STOP=<rank>:<phase>:<step>` and `VERL_PATCHES_INJECT_KILL=<rank>:<phase>:<step>` (e.g.
``1:update:3``; phases as in `progress.PHASE_ORDER`). Checked only at call and phase boundaries (a handful per step),
never per unit; unset, nothing is armed.

Each fires once per run folder (``VERL_PATCHES_RUN_DIR``, which the launcher sets): before firing, the rank creates
``fault-injected-<kind>-rank<R>-<phase>-step<S>`` there (``O_EXCL``), and a rank that finds it already made does not
fire, so a restarted trainer, which runs the same step again with the same environment, gets past it. Without a
run folder it fires every time the rank gets there.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from verl_patches.base import env_registry
from verl_patches.resilience import progress

INJECT_ENV = "VERL_PATCHES_INJECT_STOP"
INJECT_KILL_ENV = "VERL_PATCHES_INJECT_KILL"
RUN_DIR_ENV = "VERL_PATCHES_RUN_DIR"
MARKER_PREFIX = "fault-injected-"
MARKER_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC  # made here, never through a link
# variable -> (what the rank does, its signal)
ACTIONS = {INJECT_ENV: ("stops", signal.SIGSTOP), INJECT_KILL_ENV: ("kills", signal.SIGKILL)}


@dataclass(frozen=True)
class FaultAt:
    rank: int
    phase: str
    step: int
    variable: str = INJECT_ENV  # which injection: INJECT_ENV (stop) or INJECT_KILL_ENV (kill)

    def matches(self, rank: int, pos: progress.Position) -> bool:
        return rank == self.rank and pos.phase == self.phase and pos.step == self.step

    @property
    def marker(self) -> str:
        """The run folder's file that says this injection has fired."""
        kind = "kill" if self.variable == INJECT_KILL_ENV else "stop"
        return f"{MARKER_PREFIX}{kind}-rank{self.rank}-{self.phase}-step{self.step}"


def parse(raw: str, variable: str = INJECT_ENV) -> FaultAt:
    parts = raw.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"{variable}={raw!r}: expected <rank>:<phase>:<step>, e.g. 1:update:3")
    rank, phase, step = parts
    if phase not in progress.PHASE_ORDER:
        raise ValueError(f"{variable}={raw!r}: phase {phase!r} is not one of {', '.join(progress.PHASE_ORDER)}")
    try:
        return FaultAt(int(rank), phase, int(step), variable)
    except ValueError:
        raise ValueError(f"{variable}={raw!r}: rank and step must be integers") from None


def first_time(plan: FaultAt, run_dir: str) -> bool:
    """Whether ``plan`` has not fired yet in the run folder ``run_dir`` (and marks it fired); always True
    without a run folder, or when the marker cannot be made there (the fault is then injected again)."""
    if not run_dir:
        return True
    try:
        fd = os.open(os.path.join(run_dir, plan.marker), MARKER_FLAGS, 0o600)
    except FileExistsError:
        return False
    except OSError as e:
        print(f"verl_patches fault injection: cannot mark {plan.marker} in {run_dir} ({e.strerror}); injecting anyway")
        return True
    os.close(fd)
    return True


def arm(
    rank: int, environ: Mapping[str, str] | None = None, before_stop: Callable[[], object] | None = None
) -> list[FaultAt]:
    """Install this process's injections when a variable names its rank; returns what was armed.
    `before_stop` (the heartbeat's beat) publishes the position first, as a process stopped or killed from
    outside seconds into a phase would have."""
    plans = []
    for variable in ACTIONS:
        raw = env_registry.text(variable, environ)
        if raw:
            plan = parse(raw, variable)
            if plan.rank == rank:
                plans.append(plan)
    if not plans:
        return []
    run_dir = env_registry.text(RUN_DIR_ENV, environ)

    def inject_here(pos: progress.Position) -> None:
        for plan in plans:
            if plan.matches(rank, pos) and first_time(plan, run_dir):
                verb, sig = ACTIONS[plan.variable]
                print(
                    f"verl_patches fault injection: rank {rank} {verb} itself ({sig.name}, pid {os.getpid()}) "
                    f"entering {pos.describe()}",
                    flush=True,
                )
                if before_stop is not None:
                    before_stop()
                os.kill(os.getpid(), sig)

    progress.on_phase(inject_here)
    return plans
