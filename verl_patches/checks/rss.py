"""Measured memory of a process tree (the check's main process and its ranks), for the bench and the test
that hold `check_logprobs` to its estimate (`verl_patches.checks.memory`).

Summed over the process and all its descendants, every ``period`` seconds: RSS, and its anonymous part
(``RssAnon`` of /proc/PID/status: memory not backed by a file; memory-mapped checkpoint pages are the rest).
"""

from __future__ import annotations

import threading


def _status_bytes(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def anon_bytes(pid: int) -> int:
    """RssAnon of ``pid`` (0 when it is gone or the kernel does not report it)."""
    return _status_bytes(pid, "RssAnon")


def peak_rss_bytes(pid: int) -> int:
    """VmHWM of ``pid``: the kernel's own high-water mark of its RSS, which no sampling can miss (0 when the
    kernel does not report it)."""
    return _status_bytes(pid, "VmHWM")


class TreeSampler(threading.Thread):
    """Peaks of the summed RSS and RssAnon of process ``pid`` and its descendants; ``stop()`` ends it."""

    def __init__(self, pid: int, period: float = 0.2) -> None:
        super().__init__(daemon=True)
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        self.root = psutil.Process(pid)
        self.period = period
        self.peak_rss = self.peak_anon = self.procs_at_peak = 0
        self._stop_event = threading.Event()

    def sample(self) -> None:
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        rss = anon = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            anon += anon_bytes(p.pid)
        if rss > self.peak_rss:
            self.peak_rss, self.procs_at_peak = rss, len(procs)
        self.peak_anon = max(self.peak_anon, anon)

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            self._stop_event.wait(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
