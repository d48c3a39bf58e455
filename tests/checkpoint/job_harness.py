"""Launch the ranks of tests/checkpoint/actor_job.py as separate processes and kill them like a cluster does.

A rank that dies takes the job down (as Ray fails the job when a worker dies): the harness SIGKILLs the
remaining ranks. When a rank writes ``<root>/.kill_job``, the harness SIGKILLs every rank at once (the
whole job killed). Everything runs on 127.0.0.1 with a bounded time.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

JOB = Path(__file__).resolve().parent / "actor_job.py"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class JobResult:
    returncodes: list[int]
    outputs: list[str]
    killed_by_harness: str  # "", "peer died", "whole job"

    @property
    def text(self) -> str:
        return "\n".join(
            f"--- rank {r} (rc {rc}) ---\n{out[-3000:]}"
            for r, (rc, out) in enumerate(zip(self.returncodes, self.outputs))
        )


def launch(
    world: int, root: Path, args: list[str], kill: str = "", launch_id: str = "", timeout_s: float = 400
) -> JobResult:
    port = free_port()
    logs = [open(root.parent / f"{root.name}.{launch_id or 'run'}.rank{r}.log", "w+") for r in range(world)]
    procs = []
    for r in range(world):
        env = dict(
            os.environ,
            RANK=str(r),
            LOCAL_RANK=str(r),
            WORLD_SIZE=str(world),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CKPT_TEST_KILL=kill,
            CKPT_TEST_LAUNCH=launch_id,
            PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, str(JOB), "--root", str(root), *args],
                cwd=REPO,
                env=env,
                stdout=logs[r],
                stderr=subprocess.STDOUT,
            )
        )
    marker = root / ".kill_job"
    how = ""
    deadline = time.monotonic() + timeout_s
    try:
        while any(p.poll() is None for p in procs):
            if marker.exists():
                how = "whole job"
                for p in procs:
                    p.send_signal(signal.SIGKILL)
                marker.unlink()
            elif any(p.poll() not in (None, 0) for p in procs) and not how:
                how = "peer died"
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
            if time.monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.send_signal(signal.SIGKILL)
                raise TimeoutError(f"job did not finish within {timeout_s}s")
            time.sleep(0.2)
    finally:
        for p in procs:
            p.wait()
    outs = []
    for f in logs:
        f.seek(0)
        outs.append(f.read())
        f.close()
    return JobResult([p.returncode for p in procs], outs, how)
