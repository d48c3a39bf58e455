"""A process is identified by its pid and its start time, and signalled only through that identity.

A pid alone is not an identity: once a process exits its number can be given to another one, and a
signal sent by number would reach that one. Here a process is named by (pid, start time in clock ticks
since boot, field 22 of ``/proc/<pid>/stat``), and `signal_if_same` signals it through a pidfd (Linux 5.3+):
the pidfd is opened first and pins one process, its start time is then checked, and the signal goes to
that process or to none (it cannot reach a later holder of the number). Without pidfds (an older kernel)
the start time is checked just before ``kill`` (a window of microseconds instead of none).

Also here: `become_subreaper`, so that the descendants of a launcher stay its descendants even after they
leave its session (``setsid``) and their parent exits: the kernel reparents orphans to the nearest
subreaper instead of init, and `descendants` finds them all.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from dataclasses import dataclass

PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37  # linux/prctl.h


def start_ticks(pid: int | str = "self") -> int | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/<pid>/stat), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat.rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class ProcessId:
    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> ProcessId | None:
        started = start_ticks(pid)
        return None if started is None else cls(pid, started)

    def alive(self) -> bool:
        return start_ticks(self.pid) == self.started and not _zombie(self.pid)


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return False


def signal_if_same(pid: int, started: int | None, sig: int) -> bool:
    """Send `sig` to `pid` only if it is still the process that started at `started`; True if sent."""
    if started is None:
        return False
    pidfd_open = getattr(os, "pidfd_open", None)
    try:
        fd = pidfd_open(pid) if pidfd_open is not None else None
    except ProcessLookupError:
        return False
    except OSError as err:
        if err.errno not in (errno.ENOSYS, errno.EPERM, errno.EINVAL):
            return False
        fd = None
    try:
        if start_ticks(pid) != started:  # with a pidfd: the pinned process is not ours (the number was reused)
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux); True when it is one."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_dead_children(pids: list[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's exited children (orphans a subreaper
    adopted and ended; children a Popen owns are waited by their owner and must not be passed)."""
    for pid in pids:
        try:
            if _zombie(pid):
                os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # not our child: its parent reaps it
            continue


def is_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (from /proc/<pid>/task/*/children, else by scanning /proc)."""
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tasks = []
    found_file = False
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found_file = True
                out += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    if found_file:
        return sorted(set(out))
    for name in os.listdir("/proc"):  # kernels without the children file
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        out.append(int(name))
            except (OSError, ValueError, IndexError):
                continue
    return sorted(out)


def descendants(pid: int) -> list[ProcessId]:
    """Every live descendant of `pid` (children, their children, ...), with its identity."""
    out, seen, stack = [], set(), [pid]
    while stack:
        for child in children_of(stack.pop()):
            if child in seen:
                continue
            seen.add(child)
            ident = ProcessId.of(child)
            if ident is not None and not _zombie(child):
                out.append(ident)
            stack.append(child)
    return out
