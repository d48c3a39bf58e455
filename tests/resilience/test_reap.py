"""A stopped process named by its heartbeat (pid and start time) is SIGKILLed; a reused pid never is."""

from __future__ import annotations

import signal
import subprocess

from verl_patches.resilience.reap import kill_if_same, start_ticks


def test_a_stopped_process_is_killed_only_if_it_is_the_one_that_published() -> None:
    p = subprocess.Popen(["sleep", "60"])
    try:
        p.send_signal(signal.SIGSTOP)
        started = start_ticks(p.pid)
        assert started is not None and started != start_ticks("self")
        assert not kill_if_same(p.pid, started + 1)  # another process that got the same pid
        assert not kill_if_same(p.pid, None)
        assert p.poll() is None
        assert kill_if_same(p.pid, started)
        assert p.wait(timeout=10) == -signal.SIGKILL
        assert not kill_if_same(p.pid, started)  # gone
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
