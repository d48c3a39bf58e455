"""Watch one outstanding worker call: read the heartbeats of the ranks that have not answered yet, and say
when the call is hung.

The call is hung when no outstanding rank has made progress (a new mark, or activity in a coarse phase)
for the time-out. Every duration is measured on the watcher's own clock, from the moments it saw a value
change, so clocks of other nodes never enter. A slow rank that still moves, even while its peers wait
longer than the time-out, keeps the call alive; a rank that never started the call counts from the
call's start.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from verl_patches.resilience.boards import Board
from verl_patches.resilience.hang_diagnosis import Diagnosis, Observed, diagnose
from verl_patches.resilience.heartbeat_record import parse_heartbeat
from verl_patches.resilience.timeout import stale_after

STARTING_STATES = frozenset({"DEPENDENCIES_UNREADY", "PENDING_CREATION", "RESTARTING"})


def startup_allowance(timeout_s: float) -> float:
    """How long a member may be still starting (its process being created and importing its modules, before
    its constructor starts the heartbeat) before it counts as stuck."""
    return max(3 * timeout_s, 300.0)


@dataclass
class _Seen:
    beat_at: float
    progress_at: float
    beat: int | None = None
    progress: tuple[int, int] | None = None
    record: dict | None = None
    starting: dict | None = None  # what the scheduler says of a member with no heartbeat yet
    malformed: str = ""  # why its last published value was not a heartbeat (it then counts as silent)


class CallWatch:
    def __init__(
        self,
        call: str,
        step: int | None,
        members: dict[str, str],
        timeout_s: float,
        board: Board,
        clock: Callable[[], float] = time.monotonic,
        lookup: Callable[[list[str]], dict[str, dict]] | None = None,
    ) -> None:
        """`members`: board key -> how to name the member without a heartbeat. `lookup`: for members that
        never published, what the scheduler knows ({"state", "node", "pid"}; Ray's actor table): one that
        is still being created counts as moving, up to `startup_allowance`."""
        self.call, self.step, self.members, self.timeout_s, self.board, self.clock = (
            call,
            step,
            members,
            timeout_s,
            board,
            clock,
        )
        self.lookup = lookup
        self.stale_s = stale_after(timeout_s)
        self.started = clock()
        self.seen = {k: _Seen(self.started, self.started) for k in members}
        self.read_errors = 0

    def observe(self, outstanding: list[str]) -> Diagnosis | None:
        """Take one look at the outstanding members; a diagnosis when the call is hung, else None."""
        now = self.clock()
        try:
            values = self.board.read(outstanding)
        except Exception:  # the board's host may be busy or restarting: no news is no progress
            self.read_errors += 1
            values = {}
        for key in outstanding:
            raw = values.get(key)
            if not raw:
                continue
            s = self.seen[key]
            record, problem = parse_heartbeat(raw)
            s.malformed = problem
            if record is None:  # a damaged or foreign value: no news from that member, named in the report
                continue
            s.record = record
            if s.beat is not None and record["beat"] != s.beat:
                s.beat_at = now
            s.beat = record["beat"]
            moved = (int(record["pos"]["marks"]), int(record.get("activity", 0)))
            if s.progress is not None and moved != s.progress:
                s.progress_at = now
            s.progress = moved
        # no heartbeat yet, or one from a process that has not entered any call: maybe still being created
        unseen = [k for k in outstanding if self.seen[k].record is None or not self.seen[k].record["pos"]["marks"]]
        if unseen and self.lookup is not None:
            try:
                known = self.lookup(unseen)
            except Exception:
                known = {}
            for key, info in (known if isinstance(known, dict) else {}).items():
                if key not in self.seen or not isinstance(info, dict):
                    continue
                self.seen[key].starting = info
                if info.get("state") in STARTING_STATES and now - self.started < startup_allowance(self.timeout_s):
                    self.seen[key].progress_at = self.seen[key].beat_at = now
        if not outstanding or any(now - self.seen[k].progress_at < self.timeout_s for k in outstanding):
            return None
        return diagnose(self.call, self.step, self.observed(outstanding, now), self.timeout_s, self.stale_s)

    def observed(self, keys: list[str], now: float | None = None) -> list[Observed]:
        now = self.clock() if now is None else now
        return [
            Observed(self._label(k), self.seen[k].record, now - self.seen[k].beat_at, now - self.seen[k].progress_at)
            for k in keys
        ]

    def _label(self, key: str) -> str:
        seen = self.seen[key]
        bad = f" (its heartbeat value is malformed: {seen.malformed})" if seen.malformed else ""
        info = seen.starting
        if not info or not isinstance(info, dict):
            return self.members[key] + bad
        return (
            f"{self.members[key]} (node {info.get('node', '?')}, pid {info.get('pid', '?')}, scheduler state "
            f"{info.get('state', '?')}){bad}"
        )
