"""`python -m verl_patches.launch.cluster.stop RUN_DIR`: stop a launch, and nothing but what it recorded as its own.

RUN_DIR is a launch's run folder (``LOG_DIR/<profile>-<time>-<role>-<host>``) on this node. Its `pids.json`
names the launcher and the processes it started, each by pid and start time (`pid_record`). The stop

1. refuses a record of another node or of an earlier boot (its pids mean nothing here);
2. asks the launcher to stop as Ctrl-C would (SIGINT): it forwards that to the trainer's session, ends what
   the session left behind (`session_leftovers`) and stops the Ray node it started, exactly as when the trainer
   ends by itself; then waits up to ``--grace-s`` for every recorded process to be gone;
3. sends what is still there SIGTERM, then SIGKILL after ``--term-s``: each one only while it is still the
   process recorded (`process_identity.signal_if_same`: pid and start time, through a pidfd), never a process
   group, never a name, never a pid whose number another process now holds.

It prints one line per recorded process and exits 0 when none is left, 1 when one survived, 2 for a record it
cannot use. For a run submitted with `ray job submit`, `ray job stop <submission id>` stops the job (the cluster
stays); this command stops the launcher that holds the cluster.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from verl_patches.launch.pid_record import PidRecord, PidRecordError, boot_id, read_record
from verl_patches.process_identity import ProcessId, signal_if_same

LAUNCHER = "launcher"
GRACE_S = 120.0  # the launcher's own teardown: the trainer's exit, 10 s for its leftovers, up to 20 s for Ray
TERM_S = 10.0


def record_problem(record: PidRecord, here_host: str, here_boot: str) -> str:
    """Why ``record`` cannot be acted on here ('' when it can): pids and start times are per node and per boot."""
    if record.boot_id and here_boot and record.boot_id != here_boot:
        if record.host != here_host:
            return f"recorded on {record.host}, this is {here_host}: run the stop on {record.host}"
        return f"recorded before {here_host} last booted: nothing of that run is left running"
    if record.host != here_host:
        return f"recorded on {record.host}, this is {here_host}: run the stop on {record.host}"
    return ""


def _wait_gone(procs: dict[str, ProcessId], timeout_s: float) -> dict[str, ProcessId]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {n: p for n, p in procs.items() if p.alive()}  # a zombie is gone: its parent reaps it, not us
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def stop_run(
    record: PidRecord,
    say: Callable[[str], None] = print,
    grace_s: float = GRACE_S,
    term_s: float = TERM_S,
) -> int:
    """Stop the processes of ``record`` (already checked to be this node's); 0 when none is left, else 1."""
    running = {n: p for n, p in record.processes.items() if p.alive()}
    for name, p in sorted(record.processes.items()):
        if name not in running:
            say(f"{name} {p.pid}: not running (or its pid now belongs to another process, left alone)")
    if not running:
        say("stop: nothing of this run is running")
        return 0
    was_running = set(running)
    how: dict[str, str] = {}
    launcher = running.get(LAUNCHER)
    if launcher is not None and signal_if_same(launcher.pid, launcher.started, signal.SIGINT):
        say(f"{LAUNCHER} {launcher.pid}: SIGINT (its own teardown: the trainer, what it left, the Ray node)")
        running = _wait_gone(running, grace_s)
        how = {n: "ended by the launcher's teardown" for n in was_running}
    for sig, wait_s in ((signal.SIGTERM, term_s), (signal.SIGKILL, term_s)):
        if not running:
            break
        for name, p in sorted(running.items()):
            if signal_if_same(p.pid, p.started, sig):
                how[name] = f"ended by {signal.Signals(sig).name}"
        running = _wait_gone(running, wait_s)
    for name in sorted(was_running):
        pid = record.processes[name].pid
        say(f"{name} {pid}: " + ("STILL RUNNING after SIGKILL" if name in running else how.get(name, "exited")))
    if running:
        say(f"stop: {len(running)} recorded process(es) still running: {', '.join(sorted(running))}")
        return 1
    say("stop: every recorded process of this run is gone")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.cluster.stop",
        description="Stop a launch on this node: the launcher and the processes it recorded in RUN_DIR/pids.json, "
        "each only while it is still the process recorded (pid and start time); nothing else.",
    )
    p.add_argument("run_dir", type=Path, help="the launch's run folder, LOG_DIR/<profile>-<time>-<role>-<host>")
    p.add_argument("--grace-s", type=float, default=GRACE_S, help=f"for the launcher's teardown (default {GRACE_S:g})")
    p.add_argument("--term-s", type=float, default=TERM_S, help=f"after SIGTERM, before SIGKILL (default {TERM_S:g})")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        record = read_record(args.run_dir)
    except PidRecordError as e:
        print(f"stop: {e}", file=sys.stderr)
        return 2
    problem = record_problem(record, socket.gethostname(), boot_id())
    if problem:
        print(f"stop: {args.run_dir}: {problem}", file=sys.stderr)
        return 2
    return stop_run(record, grace_s=args.grace_s, term_s=args.term_s)


if __name__ == "__main__":
    sys.exit(main())
