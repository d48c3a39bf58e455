"""Where this process is in its work, recorded at the points where the host really waits.

HCCL collectives return at enqueue, so timing them on the host says nothing about a missing peer. What a
host does wait for are the boundaries of its work: a worker call (generate, ref, update, ...), the phases
inside it (weight sync, generate, d2d reshard, ...), and the units inside those (a micro-batch of
forward/backward, a bucket of the weight sync, a step of the rollout engine). Each is one `mark` here:
one tuple assigned to a module global (a few hundred nanoseconds, no lock, no I/O), read by the heartbeat
thread (`heartbeat.py`), which publishes it. Nothing here runs per collective, per layer or inside a
compiled region.

A position's phase is "coarse" when it has no inner points on every device (the vLLM engine's decode loop
on NPU has none of ours, by design): the heartbeat then also counts changes of the main thread's stack as
activity, so a long generation is not mistaken for a stall.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

# In the order a training step goes through them; a rank earlier in this order (same step) is behind.
PHASE_ORDER = (
    "init",
    "load_checkpoint",
    "weight_sync",
    "generate",
    "rollout_offload",
    "old_log_prob",
    "d2d_reshard",
    "ref",
    "update",
    "save_checkpoint",
    "idle",
)
COARSE_PHASES = frozenset({"init", "load_checkpoint", "generate", "rollout_offload", "save_checkpoint"})
# The phase each worker call starts in (generate_sequences starts with the weight sync: our sharding manager
# marks it and, after it, "generate").
CALL_PHASES = {
    "generate_sequences": "weight_sync",
    "compute_ref_log_prob": "ref",
    "compute_log_prob": "old_log_prob",
    "update_actor": "update",
    "init_model": "init",
    "save_checkpoint": "save_checkpoint",
    "load_checkpoint": "load_checkpoint",
}


def phase_of_call(call: str) -> str | None:
    """The phase a worker-group method starts in ("actor_rollout_ref_update_actor" -> "update")."""
    for name, first in CALL_PHASES.items():
        if call == name or call.endswith("_" + name):
            return first
    return None


# marks, call, step, phase, unit, index, total, group, coarse, monotonic time of the mark
_Pos = tuple
_IDLE: _Pos = (0, "", None, "idle", "", None, None, 0, False, 0.0)
_pos: _Pos = _IDLE
_on_phase: Callable[[Position], None] | None = None  # fault injection (tests), None otherwise


@dataclass(frozen=True)
class Position:
    marks: int  # progress points passed so far in this process
    call: str  # the worker call it is in (the last one while idle; "" before the first)
    step: int | None  # the trainer step (kept between calls)
    phase: str
    unit: str = ""  # "micro-batch", "bucket", "engine step", ...
    index: int | None = None
    total: int | None = None
    group: int = 0  # which batch of micro-batches inside the call (1-based; 0 = none yet)
    coarse: bool = False

    def order_key(self) -> tuple[int, int, int, int]:
        """Comparable across ranks of one job: a smaller key is further behind."""
        phase = PHASE_ORDER.index(self.phase) if self.phase in PHASE_ORDER else len(PHASE_ORDER)
        return (-1 if self.step is None else self.step, phase, self.group, -1 if self.index is None else self.index)

    def describe(self) -> str:
        """ "phase 'update' (micro-batch 2/4 of batch 1) of step 3 in update_actor" and the like."""
        inner = ""
        if self.unit and self.index is not None:
            inner = f"{self.unit} {self.index}" + (f"/{self.total}" if self.total else "")
            if self.group > 1 or (self.group == 1 and self.unit == "micro-batch"):
                inner += f" of batch {self.group}"
        where = f"phase '{self.phase}'" + (f" ({inner})" if inner else "")
        where += f" of step {'?' if self.step is None else self.step}"
        if not self.call:
            return where
        return where + (f" after {self.call}" if self.phase == "idle" else f" in {self.call}")

    def to_dict(self) -> dict:
        return {
            "marks": self.marks,
            "call": self.call,
            "step": self.step,
            "phase": self.phase,
            "unit": self.unit,
            "index": self.index,
            "total": self.total,
            "group": self.group,
            "coarse": self.coarse,
        }

    @staticmethod
    def from_dict(d: dict) -> Position:
        return Position(
            int(d["marks"]),
            str(d["call"]),
            d["step"],
            str(d["phase"]),
            str(d.get("unit", "")),
            d.get("index"),
            d.get("total"),
            int(d.get("group", 0)),
            bool(d.get("coarse", False)),
        )


def current() -> tuple[Position, float]:
    """This process's position and the seconds since its last mark."""
    p = _pos
    return Position(*p[:9]), (time.monotonic() - p[9]) if p[9] else 0.0


def enter_call(call: str, step: int | None, phase: str) -> None:
    """A worker call starts; `step` None keeps the last one (validation and setup calls carry none)."""
    global _pos
    p = _pos
    _pos = (
        p[0] + 1,
        call,
        p[2] if step is None else int(step),
        phase,
        "",
        None,
        None,
        0,
        phase in COARSE_PHASES,
        time.monotonic(),
    )
    if _on_phase is not None:
        _on_phase(current()[0])


def leave_call() -> None:
    """The call returned: idle, after it."""
    global _pos
    p = _pos
    _pos = (p[0] + 1, p[1], p[2], "idle", "", None, None, 0, False, time.monotonic())


def phase(name: str) -> None:
    """A phase boundary inside the current call."""
    global _pos
    p = _pos
    _pos = (p[0] + 1, p[1], p[2], name, "", None, None, p[7], name in COARSE_PHASES, time.monotonic())
    if _on_phase is not None:
        _on_phase(current()[0])


def begin_group() -> None:
    """A new batch of units (the micro-batches of one forward/backward pass)."""
    global _pos
    p = _pos
    _pos = (p[0] + 1, p[1], p[2], p[3], p[4], None, p[6], p[7] + 1, p[8], time.monotonic())


def unit(kind: str, index: int, total: int | None = None) -> None:
    """One unit of work done inside the current phase (the hot path: one tuple, one clock read)."""
    global _pos
    p = _pos
    _pos = (p[0] + 1, p[1], p[2], p[3], kind, index, total, p[7], p[8], time.monotonic())


def on_phase(hook: Callable[[Position], None] | None) -> None:
    """Run `hook` at every call and phase boundary (fault injection); None removes it."""
    global _on_phase
    _on_phase = hook


def reset() -> None:
    """Back to the state of a fresh process (tests)."""
    global _pos, _on_phase
    _pos, _on_phase = _IDLE, None
