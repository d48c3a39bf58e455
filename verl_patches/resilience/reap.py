"""End a stopped worker process of the job: Ray's ``ray.kill`` asks the actor's process to exit, which a
SIGSTOPped (or otherwise frozen) process never does, so the driver SIGKILLs it itself, on its node.

A process is named by its heartbeat: node id, pid and start time (clock ticks since boot, from
``/proc/<pid>/stat``), so a pid that was reused by another process is never signalled.
"""

from __future__ import annotations

import signal
from typing import Any

from verl_patches.process_identity import signal_if_same, start_ticks  # noqa: F401  (start_ticks: heartbeats)


def kill_if_same(pid: int, started: int | None) -> bool:
    """SIGKILL `pid` if it is still the process that started at `started` (through a pidfd: a reused number is
    never signalled); True if signalled."""
    return signal_if_same(pid, started, signal.SIGKILL)


def kill_processes(records: list[dict[str, Any]], timeout_s: float = 30.0) -> int:
    """SIGKILL the processes these heartbeats name: directly on this node, by a task pinned to theirs
    elsewhere. Returns how many were signalled (or asked to be)."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    done, remote = 0, []
    for r in records:
        pid, started = r.get("pid"), r.get("started")
        if not isinstance(pid, int) or not isinstance(started, int) or isinstance(pid, bool):
            continue
        if r.get("node_id") in (None, here):
            done += kill_if_same(int(r["pid"]), int(r["started"]))
        else:
            task = ray.remote(kill_if_same).options(
                num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(r["node_id"], soft=False)
            )
            remote.append(task.remote(int(r["pid"]), int(r["started"])))
    if remote:
        ready, _ = ray.wait(remote, num_returns=len(remote), timeout=timeout_s)
        done += sum(bool(x) for x in ray.get(ready))
    return done
