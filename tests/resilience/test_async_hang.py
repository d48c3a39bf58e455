"""The CPU proof with asynchronous semantics: gloo all_reduces issued with ``async_op=True`` and waited one
micro-batch later (`async_rank.py`, three ranks). The last rank stops taking part entering micro-batch 3 of
step 2: killed, frozen (SIGSTOP) or stuck in Python. The watcher here plays the driver of a Ray job with the
same code (`CallWatch` over the ranks' heartbeats on the job's store, `diagnose`, the report line): it names
that rank with its phase, step and micro-batch within the time-out plus a bounded slack, then ends the job;
nothing hangs. A rank that is slow (0.7 time-out twice in a row, its peers blocked 1.4 time-outs) but
alive is not reported and the job finishes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from verl_patches.resilience.boards import StoreBoard
from verl_patches.resilience.call_watch import CallWatch
from verl_patches.resilience.hang_diagnosis import REPORT_PREFIX, death_message, hang_message
from verl_patches.resilience.timeout import publish_interval

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("async_rank.py")
WORLD, TIMEOUT_S = 3, 4.0
SLACK_S = 3.0  # the watcher's look interval, the peers' last marks after the fault, a loaded 2-core host
FAULTY = WORLD - 1

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]


class Job:
    def __init__(self, mode: str) -> None:
        self.server = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60)
        )
        env = {
            **os.environ,
            "WORLD_SIZE": str(WORLD),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(self.server.port),
            "PYTHONPATH": str(REPO),
            "OMP_NUM_THREADS": "1",
            "PYTHONWARNINGS": "ignore",
        }
        self.procs = [
            subprocess.Popen(
                [sys.executable, str(SCRIPT), mode, str(TIMEOUT_S)],
                cwd=REPO,
                env={**env, "RANK": str(r)},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for r in range(WORLD)
        ]
        self.outputs: list[str] = []

    def watch(self, limit_s: float = 120.0) -> tuple[str | None, float]:
        """Play the driver: look at the outstanding ranks until the job ends or is reported (then end it)."""
        keys = {f"rank{r}": f"rank {r}" for r in range(WORLD)}
        board, deadline = StoreBoard(self.server), time.monotonic() + limit_s
        # the "call" starts once every rank is up (a Ray worker's heartbeat starts with the actor, before any call)
        while time.monotonic() < deadline and not all(board.read(list(keys)).values()):
            time.sleep(0.1)
        watch = CallWatch("update_actor", None, keys, TIMEOUT_S, board)
        report = None
        try:
            while time.monotonic() < deadline:
                codes = {r: p.poll() for r, p in enumerate(self.procs)}
                died = [f"rank{r}" for r, c in codes.items() if c is not None and c < 0]
                if died:
                    watch.observe(died)
                    report = death_message(
                        "update_actor", None, watch.observed(died), f"killed by signal {-codes[int(died[0][4:])]}"
                    )
                    break
                outstanding = [f"rank{r}" for r, c in codes.items() if c is None]
                if not outstanding:
                    break
                d = watch.observe(outstanding)
                if d is not None:
                    report = hang_message(d)
                    break
                time.sleep(publish_interval(TIMEOUT_S))
            return report, time.time()
        finally:
            self.end()

    def end(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)  # a stopped process is killed all the same; reaped cleanly
                p.kill()
        self.outputs = [p.communicate(timeout=30)[0] for p in self.procs]

    def fault_times(self) -> list[float]:
        return [float(m) for m in re.findall(r"fault \w+ at ([0-9.]+)", self.outputs[FAULTY])]


@pytest.mark.parametrize("mode", ["frozen", "python", "killed"])
def test_a_peer_that_never_joins_is_named_with_phase_step_and_micro_batch(mode: str) -> None:
    job = Job(mode)
    report, reported_at = job.watch()
    assert all(p.poll() is not None for p in job.procs)  # nothing hangs
    assert report is not None, job.outputs
    (fault_at,) = job.fault_times()
    waited = reported_at - fault_at
    where = "phase 'update' (micro-batch 2/4 of batch 1) of step 2 in update_actor"
    assert report.startswith(REPORT_PREFIX) and "\n" not in report
    if mode == "killed":
        assert f"worker process died: rank {FAULTY} (node 127.0.0.1 " in report and f"last in {where}" in report
        assert "(killed by signal 9)" in report
        assert waited < TIMEOUT_S + SLACK_S, (waited, report)
        return
    assert TIMEOUT_S <= waited <= TIMEOUT_S + SLACK_S, (waited, report)
    pid = job.procs[FAULTY].pid
    if mode == "frozen":
        assert f"stuck: rank {FAULTY} (node 127.0.0.1 " in report and f", pid {pid}) stopped reporting " in report
        assert f"(process frozen or dead), last in {where}" in report
    else:
        assert (
            f"stuck: rank {FAULTY} (node 127.0.0.1 " in report
            and f"pid {pid}) is alive but made no progress " in report
            and f"in {where} while its peers moved past it; main thread at " in report
        )
        assert "async_rank.py:" in report and "misbehave" in report
    # its peers issued micro-batch 4's collective and block on micro-batch 3's, one micro-batch later
    assert (
        "waiting on it: ranks 0,1 in phase 'update' (micro-batch 4/4 of batch 1) of step 2 in update_actor "
        "(alive)" in report
    ), report


def test_a_slow_but_live_rank_is_not_reported() -> None:
    job = Job("slow")
    report, _ = job.watch()
    assert report is None, report
    assert [p.returncode for p in job.procs] == [0] * WORLD, job.outputs
    assert all("done" in out for out in job.outputs)
    first, second = job.fault_times()
    assert second - first >= 0.7 * TIMEOUT_S  # its peers waited 1.4 time-outs in all, in two stretches
