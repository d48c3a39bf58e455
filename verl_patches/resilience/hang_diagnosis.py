"""Who is holding a collective up: a pure function over the progress every rank of the group published.

Each rank publishes a `RankStatus` (its step, and for every process group it uses, how many collectives it
has entered there and what it is doing now). When this rank has waited in collective number `seq` of a
group for longer than the timeout, the ranks to blame are the group's members that have not entered that
collective: those that are alive but elsewhere (named with where they are), and those whose heartbeat
stopped (dead or frozen process).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RankStatus:
    rank: int
    step: int | None  # the trainer step this rank is in (None before the first one)
    heartbeat: float  # wall time of its last publication
    entered: dict[str, int] = field(default_factory=dict)  # group key -> number of collectives entered there
    current: str = ""  # "op #seq on group" while inside a collective, "" otherwise
    current_since: float | None = None


@dataclass(frozen=True)
class Hang:
    op: str
    group: str
    seq: int  # 1-based index of the collective in that group, on this rank
    step: int | None
    waited_s: float


def group_key(ranks: list[int] | tuple[int, ...]) -> str:
    return ",".join(str(r) for r in sorted(ranks))


def blame(me: int, hang: Hang, members: list[int], statuses: dict[int, RankStatus | None], now: float,
          heartbeat_timeout_s: float) -> list[str]:
    """One description per member holding the collective up (empty when every member has entered it)."""
    out = []
    for r in sorted(members):
        if r == me:
            continue
        st = statuses.get(r)
        if st is None:
            out.append(f"rank {r} never reported (not started, or died before its first collective)")
            continue
        if now - st.heartbeat > heartbeat_timeout_s:
            out.append(f"rank {r} stopped reporting {now - st.heartbeat:.0f} s ago (process dead or frozen), "
                       f"last in step {_step(st.step)}" + (f" inside {st.current}" if st.current else ""))
            continue
        entered = st.entered.get(hang.group, 0)
        if entered >= hang.seq:
            continue  # it reached this collective: it waits with us
        where = f"inside {st.current} for {now - st.current_since:.0f} s" if st.current and st.current_since \
            else "outside any collective"
        out.append(f"rank {r} is alive but has entered only {entered} collective(s) on this group (this is "
                   f"#{hang.seq}): it is in step {_step(st.step)}, {where}")
    return out


def hang_message(me: int, hang: Hang, members: list[int], statuses: dict[int, RankStatus | None], now: float,
                 heartbeat_timeout_s: float) -> str:
    culprits = blame(me, hang, members, statuses, now, heartbeat_timeout_s)
    head = (f"collective hang: rank {me} waited {hang.waited_s:.0f} s in {hang.op} #{hang.seq} on group "
            f"[{hang.group}] at step {_step(hang.step)}")
    if not culprits:
        return head + "; every member of the group entered it (a transport or device fault, not a missing rank)"
    return head + "; held up by: " + "; ".join(culprits)


def _step(step: int | None) -> str:
    return "?" if step is None else str(step)
