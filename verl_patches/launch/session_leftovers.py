"""What is left of a child's own session once the child has exited, and ending it.

The launcher starts the trainer in a session of its own (``start_new_session``): the local Ray instance the
trainer starts (GCS, raylet, dashboard agent, workers) belongs to that session. When the trainer ends on an
error, for example a hang report, Ray's helpers can outlive it by many seconds on a loaded host (the
dashboard agent was seen alive 10 s after the launcher's last line). The launcher must not return with
parts of its job still running, so it waits a short grace for them to exit by themselves, then ends
them.

Which processes: those of that session (the launcher created it, nothing else runs in it), and, since a
process can leave the session (``setsid``), every descendant of the launcher outside the subtrees it keeps
(its Ray node): the launcher is a subreaper (`process_identity.become_subreaper`), so an orphan that left
the session is reparented to it, not to init. Each is named by pid and start time when found and signalled
only through that identity (`process_identity.signal_if_same`: a pidfd), never by a number alone.

A session id is a number too: the leader's pid. Once the leader is reaped the number can be handed to a new
process, which may start a session of its own with that id (another job of the same user, whose processes
a scan by id alone would end). So the session is named by its leader's identity (pid and start time,
recorded when the launcher started it), and its members are looked up only while that leader still holds
its number: alive, or exited and not yet reaped (`wait_exited` waits for its exit without reaping it). The
kernel gives no process a pid that a zombie still holds, so no other session can have that id then; a
member must also have started after the leader. A leader that no longer holds its number (reaped, or its
start time differs) has no members here: only the launcher's own descendants are ended.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable

import psutil

from verl_patches.process_identity import ProcessId, descendants, reap_dead_children, signal_if_same, start_ticks

GRACE_S = 10.0  # the time Ray's own teardown gets first
TERM_S = 5.0  # after SIGTERM, before SIGKILL


def wait_exited(pid: int) -> None:
    """Block until the child `pid` has exited, without reaping it: until its parent waits for it, its number
    (and so its session's and group's ids) stays its own."""
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:  # already reaped: nothing left to wait for
        return


def holds_its_number(leader: ProcessId) -> bool:
    """Whether the process `leader` names still holds its pid (alive, or a zombie not yet reaped)."""
    return start_ticks(leader.pid) == leader.started


def session_members(leader: ProcessId | None) -> list[psutil.Process]:
    """Live (non-zombie) processes of the session `leader` started (its id is the leader's pid), this process and
    the leader (its owner ends it) excluded; none unless the leader still holds its number, and none that
    started before it."""
    if leader is None or not holds_its_number(leader):
        return []
    out = []
    for p in psutil.process_iter():
        try:
            if (
                p.pid in (os.getpid(), leader.pid)
                or os.getsid(p.pid) != leader.pid
                or p.status() == psutil.STATUS_ZOMBIE
            ):
                continue
            started = start_ticks(p.pid)
            if started is not None and started >= leader.started:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    # checked again after the scan: had the leader been reaped meanwhile, what was found could be another's
    return out if holds_its_number(leader) else []


def leftovers(leader: ProcessId | None, adopted_from: int | None = None, keep: Iterable[int] = ()) -> list[ProcessId]:
    """The live processes of the session `leader` started (`session_members`), and (with `adopted_from`, the
    launcher) its live descendants outside the subtrees rooted at `keep`; each with its identity."""
    found = {ident for p in session_members(leader) if (ident := ProcessId.of(p.pid)) is not None}
    if adopted_from is not None:
        kept = set(keep)
        for k in keep:
            kept |= {d.pid for d in descendants(k)}
        found |= {d for d in descendants(adopted_from) if d.pid not in kept and d.pid != os.getpid()}
    return sorted(found, key=lambda i: i.pid)


def _describe(ident: ProcessId) -> str:
    try:
        p = psutil.Process(ident.pid)
        return f"{ident.pid} ({' '.join(p.cmdline())[:80] or p.name()})"
    except psutil.Error:
        return f"{ident.pid} (gone)"


def _wait_gone(idents: list[ProcessId], timeout_s: float) -> list[ProcessId]:
    deadline = time.monotonic() + timeout_s
    while True:
        reap_dead_children([i.pid for i in idents])  # leftovers are never the Popen-owned trainer
        left = [i for i in idents if i.alive()]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def end_session_leftovers(
    leader: ProcessId | None,
    say: Callable[[str], None],
    grace_s: float | None = None,
    term_s: float = TERM_S,
    adopted_from: int | None = None,
    keep: Iterable[int] = (),
) -> list[str]:
    """Wait up to `grace_s` for the leftovers (`leftovers`) of the session `leader` started (its identity as
    recorded when it was started; call this after `wait_exited`, before reaping it) to exit, then SIGTERM the
    rest, then SIGKILL what is still there after `term_s`; says one line when it had to end any, and returns
    their descriptions."""
    keep = tuple(keep)
    grace_s = GRACE_S if grace_s is None else grace_s
    deadline = time.monotonic() + grace_s
    while True:
        left = leftovers(leader, adopted_from, keep)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if not left:
        return []
    names = [_describe(i) for i in left]
    for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, term_s)):
        for i in left:
            signal_if_same(i.pid, i.started, sig)
        left = _wait_gone(left, wait_s)
        if not left:
            break
    say(
        f"ended {len(names)} process(es) of the trainer's session still running {grace_s:.0f} s after it exited: "
        + ", ".join(names)
        + (f"; still alive: {', '.join(_describe(i) for i in left)}" if left else "")
    )
    return names
