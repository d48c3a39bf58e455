"""What is left of a child's own session once the child has exited, and ending it.

The launcher starts the trainer in a session of its own (``start_new_session``): the local Ray instance the
trainer starts (GCS, raylet, dashboard agent, workers) belongs to that session. When the trainer ends on an
error, for example a hang report, Ray's helpers can outlive it by many seconds on a loaded host (the
dashboard agent was seen alive 10 s after the launcher's last line). The launcher must not return with
parts of its job still running, so it waits a short grace for them to exit by themselves, then ends
them. Only processes of that session are touched: the launcher created it, nothing else runs in it.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import psutil

GRACE_S = 10.0  # the time Ray's own teardown gets first
TERM_S = 5.0  # after SIGTERM, before SIGKILL


def session_members(sid: int) -> list[psutil.Process]:
    """Live (non-zombie) processes whose session id is `sid`, this process excluded."""
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _describe(p: psutil.Process) -> str:
    try:
        return f"{p.pid} ({' '.join(p.cmdline())[:80] or p.name()})"
    except psutil.Error:
        return f"{p.pid} (gone)"


def _wait_gone(sid: int, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = session_members(sid)
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def end_session_leftovers(sid: int, say: Callable[[str], None], grace_s: float = GRACE_S,
                          term_s: float = TERM_S) -> list[str]:
    """Wait up to `grace_s` for the session's processes to exit, then SIGTERM the rest, then SIGKILL what is
    still there after `term_s`; says one line when it had to end any, and returns their descriptions."""
    left = _wait_gone(sid, grace_s)
    if not left:
        return []
    names = [_describe(p) for p in left]
    for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, term_s)):
        for p in left:
            try:
                p.send_signal(sig)
            except psutil.Error:
                continue
        left = _wait_gone(sid, wait_s)
        if not left:
            break
    say(f"ended {len(names)} process(es) of the trainer's session still running {grace_s:.0f} s after it exited: "
        + ", ".join(names) + (f"; still alive: {', '.join(_describe(p) for p in left)}" if left else ""))
    return names
