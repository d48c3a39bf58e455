"""A rank that stops taking part in a collective is named, with the collective and the step, within the
configured time-out (gloo on CPU standing in for a stuck HCCL peer)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verl_patches.resilience.collective_watchdog import EXIT_HANG, TIMEOUT_ENV, CollectiveWatchdog, configured_timeout

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("hang_rank.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(world: int, mode: str, timeout_s: float) -> list[subprocess.Popen]:
    port = _free_port()
    procs = []
    for r in range(world):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), TIMEOUT_ENV: str(timeout_s), "PYTHONPATH": str(REPO),
               "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        procs.append(subprocess.Popen([sys.executable, str(SCRIPT), mode], cwd=REPO, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["alive", "frozen"])
def test_stuck_rank_is_named_with_collective_and_step(mode: str) -> None:
    world, timeout_s = 3, 4.0
    procs = _launch(world, mode, timeout_s)
    stuck = procs[-1]
    try:
        outs = []
        for p in procs[:-1]:
            out, err = p.communicate(timeout=180)
            outs.append((p.returncode, out, err))
    finally:
        if mode == "frozen":
            os.kill(stuck.pid, signal.SIGCONT)  # so that it can be killed and reaped cleanly
        stuck.kill()
        stuck.communicate()
    for rank, (rc, out, err) in enumerate(outs):
        assert "steps done" in out, err[-3000:]
        assert rc == EXIT_HANG, (rc, err[-3000:])
        line = next(l for l in err.splitlines() if l.startswith("collective hang:"))
        assert f"collective hang: rank {rank} waited" in line
        assert "in all_reduce #5 on group [0,1,2] at step 5" in line
        if mode == "alive":
            assert "rank 2 is alive but has entered only 4 collective(s) on this group (this is #5)" in line
            assert "step 5, outside any collective" in line
        else:
            assert "rank 2 stopped reporting" in line and "(process dead or frozen)" in line
        waited = float(line.split(" waited ")[1].split(" s ")[0])
        assert timeout_s <= waited <= timeout_s + 3


class FakeStore:
    def __init__(self) -> None:
        self.d: dict[str, str] = {}

    def set(self, k: str, v: str) -> None:
        self.d[k] = v

    def check(self, keys: list[str]) -> bool:
        return all(k in self.d for k in keys)

    def get(self, k: str) -> bytes:
        return self.d[k].encode()


def test_watchdog_unit_with_a_fake_clock_and_store() -> None:
    now = [100.0]
    store = FakeStore()
    a = CollectiveWatchdog(0, store, timeout_s=10, poll_s=1, clock=lambda: now[0])
    b = CollectiveWatchdog(1, store, timeout_s=10, poll_s=1, clock=lambda: now[0])
    for wd in (a, b):
        wd.set_step(3)
        wd.enter("broadcast", [0, 1]); wd.leave()
    a.enter("all_reduce", [0, 1])
    b.check_once()
    assert a.check_once() is None  # not yet over time
    now[0] += 11
    b.check_once()  # b is alive (fresh heartbeat) but never entered #2
    msg = a.check_once()
    assert msg.startswith("collective hang: rank 0 waited 11 s in all_reduce #2 on group [0,1] at step 3")
    assert "rank 1 is alive but has entered only 1 collective(s)" in msg
    b.enter("all_reduce", [0, 1])
    b.check_once()
    assert "every member of the group entered it" in a.check_once()


def test_timeout_setting_is_validated(monkeypatch) -> None:
    monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    assert configured_timeout() == 0
    monkeypatch.setenv(TIMEOUT_ENV, "30")
    assert configured_timeout() == 30
    for bad in ("soon", "-1"):
        monkeypatch.setenv(TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=TIMEOUT_ENV):
            configured_timeout()


class DeadStore(FakeStore):
    def set(self, k: str, v: str) -> None:
        raise RuntimeError("Broken pipe")


def test_an_over_time_collective_is_reported_even_when_the_store_is_gone() -> None:
    """Rank 0 hosts the store and may exit first after reporting: its peers must still report, not hang."""
    now = [0.0]
    wd = CollectiveWatchdog(1, DeadStore(), timeout_s=5, poll_s=1, clock=lambda: now[0])
    wd.set_step(9)
    wd.enter("all_reduce", [0, 1, 2])
    assert wd.check_once() is None
    now[0] = 6
    msg = wd.check_once()
    assert msg.startswith("collective hang: rank 1 waited 6 s in all_reduce #1 on group [0,1,2] at step 9")
    assert "the peers' status could not be read (the job's store is unreachable: Broken pipe)" in msg
