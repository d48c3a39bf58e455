"""Fault injection for the hang tests: one rank stops itself (SIGSTOP) when it enters a given phase of a
given step, as a host stuck in I/O, a swapped-out or paused process would.

`VERL_PATCHES_INJECT_STOP=<rank>:<phase>:<step>` (e.g. ``1:update:3``; phases as in `progress.PHASE_ORDER`).
Checked only at call and phase boundaries (a handful per step), never per unit; unset, nothing is armed.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from verl_patches.base import env_registry
from verl_patches.resilience import progress

INJECT_ENV = "VERL_PATCHES_INJECT_STOP"


@dataclass(frozen=True)
class StopAt:
    rank: int
    phase: str
    step: int

    def matches(self, rank: int, pos: progress.Position) -> bool:
        return rank == self.rank and pos.phase == self.phase and pos.step == self.step


def parse(raw: str) -> StopAt:
    parts = raw.strip().split(":")
    if len(parts) != 3:
        raise ValueError(f"{INJECT_ENV}={raw!r}: expected <rank>:<phase>:<step>, e.g. 1:update:3")
    rank, phase, step = parts
    if phase not in progress.PHASE_ORDER:
        raise ValueError(f"{INJECT_ENV}={raw!r}: phase {phase!r} is not one of {', '.join(progress.PHASE_ORDER)}")
    try:
        return StopAt(int(rank), phase, int(step))
    except ValueError:
        raise ValueError(f"{INJECT_ENV}={raw!r}: rank and step must be integers") from None


def arm(
    rank: int, environ: Mapping[str, str] | None = None, before_stop: Callable[[], object] | None = None
) -> StopAt | None:
    """Install the stop for this process when the variable names it; returns what was armed.
    `before_stop` (the heartbeat's beat) publishes the position first, as a process stopped from outside
    seconds into a phase would have."""
    raw = env_registry.text(INJECT_ENV, environ)
    if not raw:
        return None
    plan = parse(raw)
    if plan.rank != rank:
        return None

    def stop_here(pos: progress.Position) -> None:
        if plan.matches(rank, pos):
            print(
                f"verl_patches fault injection: rank {rank} stops itself (SIGSTOP, pid {os.getpid()}) entering "
                f"{pos.describe()}",
                flush=True,
            )
            if before_stop is not None:
                before_stop()
            os.kill(os.getpid(), signal.SIGSTOP)

    progress.on_phase(stop_here)
    return plan
