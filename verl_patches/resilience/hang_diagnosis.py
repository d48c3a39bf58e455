"""Who holds a worker call up, and the one line that says so (pure).

Input: for every rank whose result is still outstanding, its last heartbeat (`heartbeat.py`; None if it
never published one) and two durations the watcher measured on its own clock: how long the heartbeat has
not changed (``silent_s``) and how long its progress has not moved (``stalled_s``). A rank is

* frozen or dead: its heartbeat has not changed for ``stale_s`` (a SIGSTOPped, killed or swapped-out
  process: its side thread cannot publish either);
* behind: alive, but at an earlier position than another outstanding rank (its peers moved on; it is the
  one they wait for: stuck in Python, in I/O, in a kernel that never returns);
* never reported: no heartbeat at all.

When every outstanding rank is alive and at the same position, no rank is behind another: all are named
with that position (a device, transport or collective fault, for HCCL's flight recorder to tell).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from verl_patches.resilience.progress import Position, phase_of_call
from verl_patches.resilience.timeout import TIMEOUT_ENV

REPORT_PREFIX = "verl_patches hang:"


@dataclass(frozen=True)
class Observed:
    label: str  # how to name it without a heartbeat ("worker 3 of the group")
    record: dict | None  # its last heartbeat payload
    silent_s: float  # since its heartbeat last changed (or since the watch began)
    stalled_s: float  # since its progress last moved (or since the watch began)

    @property
    def rank(self) -> int | None:
        return None if self.record is None else self.record.get("rank")

    @property
    def position(self) -> Position | None:
        return None if self.record is None else Position.from_dict(self.record["pos"])


@dataclass(frozen=True)
class Diagnosis:
    call: str
    step: int | None
    timeout_s: float
    stalled_s: float
    culprits: list[str]
    culprit_ranks: list[int]
    waiting: list[str] = field(default_factory=list)
    same_place: bool = False  # every outstanding rank alive at one position: none is behind


def diagnose(call: str, step: int | None, outstanding: list[Observed], timeout_s: float, stale_s: float) -> Diagnosis:
    never = [o for o in outstanding if o.record is None]
    frozen = [o for o in outstanding if o.record is not None and o.silent_s >= stale_s]
    alive = [o for o in outstanding if o.record is not None and o.silent_s < stale_s]
    culprits = [
        f"{o.label} never reported a heartbeat (it did not start, or froze before its first report)" for o in never
    ]
    culprits += [_frozen(o, call) for o in frozen]
    ranks = [o.rank for o in frozen if o.rank is not None]
    waiting: list[Observed] = []
    same_place = False
    if alive:
        keys = {id(o): o.position.order_key() for o in alive}
        low = min(keys.values())
        behind = [o for o in alive if keys[id(o)] == low]
        if len(behind) < len(alive):
            culprits += [_behind(o, call) for o in behind]
            ranks += [o.rank for o in behind]
            waiting = [o for o in alive if keys[id(o)] != low]
        elif culprits:
            waiting = alive
        else:
            same_place = True
            culprits.append(_same_place(alive))
            ranks += [o.rank for o in alive]
    stalled = min((o.stalled_s for o in outstanding), default=0.0)
    if step is None:  # the watcher did not know it: the step the outstanding ranks are in
        steps = [o.position.step for o in outstanding if o.record is not None and o.position.step is not None]
        step = max(steps) if steps else None
    return Diagnosis(
        call,
        step,
        timeout_s,
        stalled,
        culprits,
        sorted(r for r in ranks if r is not None),
        _grouped(waiting),
        same_place,
    )


def hang_message(d: Diagnosis, extra: str = "") -> str:
    step = "?" if d.step is None else d.step
    head = (
        f"{REPORT_PREFIX} {d.call} (step {step}) made no progress for {d.stalled_s:.0f} s "
        f"({TIMEOUT_ENV}={d.timeout_s:g}); stuck: " + "; ".join(d.culprits)
    )
    if d.waiting:
        head += f"; waiting on {'it' if len(d.culprit_ranks) <= 1 else 'them'}: " + "; ".join(d.waiting)
    return head + (f"; {extra}" if extra else "")


def death_message(call: str, step: int | None, dead: list[Observed], error: str) -> str:
    """A worker process died during the call (Ray lost its actor): name it with its last position."""
    if step is None:
        step = next((o.position.step for o in dead if o.record is not None), None)
    step_txt = "?" if step is None else step
    parts = []
    for o in dead:
        if o.record is None:
            parts.append(f"{o.label} (no heartbeat)")
        else:
            parts.append(f"{_who(o)} last in {o.position.describe()}{_log(o)}")
    return f"{REPORT_PREFIX} {call} (step {step_txt}): worker process died: " + "; ".join(parts) + f" ({error})"


def _who(o: Observed) -> str:
    r = o.record or {}
    return f"rank {r.get('rank', '?')} (node {r.get('node', '?')} {r.get('host', '')}, pid {r.get('pid', '?')})"


def _log(o: Observed) -> str:
    r = o.record or {}
    return f"; its log: {r.get('node', '?')}:{r['log']}" if r.get("log") else ""


def _where(o: Observed) -> str:
    w = (o.record or {}).get("where")
    return f"; main thread at {w}" if w else ""


def _frozen(o: Observed, call: str = "") -> str:
    return (
        f"{_who(o)} stopped reporting {o.silent_s:.0f} s ago (process frozen or dead), last in "
        f"{o.position.describe()}{_not_started(o, call)}{_log(o)}"
    )


def _not_started(o: Observed, call: str) -> str:
    """Idle between calls while the driver waits for this one: say which phase it never entered."""
    pos = o.position
    first = phase_of_call(call)
    if pos is None or pos.phase != "idle" or first is None:
        return ""
    return f"; it has not started {call} (phase '{first}')"


def _behind(o: Observed, call: str = "") -> str:
    return (
        f"{_who(o)} is alive but made no progress for {o.stalled_s:.0f} s in {o.position.describe()} while "
        f"its peers moved past it{_not_started(o, call)}{_where(o)}{_log(o)}"
    )


def rank_list(ranks: list[int]) -> str:
    """ "0,1,4-9,12": runs of three or more as a range, so 255 waiting ranks stay short."""
    out: list[str] = []
    ordered = sorted(set(ranks))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out += [f"{ordered[i]}-{ordered[j]}"] if j - i >= 2 else [str(r) for r in ordered[i : j + 1]]
        i = j + 1
    return ",".join(out)


def _same_place(alive: list[Observed]) -> str:
    ranks = rank_list([o.rank for o in alive if o.rank is not None])
    first = alive[0]
    return (
        f"no rank is behind another: ranks {ranks} are all alive and stopped in {first.position.describe()}"
        f"{_where(first)} (a device, transport or collective fault; see each rank's log)"
    )


def _grouped(observed: list[Observed]) -> list[str]:
    by_place: dict[str, list[int]] = {}
    for o in observed:
        by_place.setdefault(o.position.describe(), []).append(o.rank)
    out = []
    for place, ranks in sorted(by_place.items(), key=lambda kv: min((r for r in kv[1] if r is not None), default=-1)):
        names = rank_list([r for r in ranks if r is not None])
        out.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {names} in {place} (alive)")
    return out


def last_report(text: str) -> str | None:
    """The last hang report in a log (the launcher repeats it as its last line), from its prefix on."""
    at = text.rfind(REPORT_PREFIX)
    if at < 0:
        return None
    return text[at:].splitlines()[0].rstrip()
