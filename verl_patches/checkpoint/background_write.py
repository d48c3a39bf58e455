"""One rank's checkpoint files written by a thread of their own, and the fence that waits for them (issue 42).

A save in the background has two halves. In the foreground the rank takes a snapshot of what it will write
(`verl_patches.train_engine.actor_state.snapshot_actor`: views of the host buffers the offloaded weights and
the swap optimizer already live in, host copies of what lives on the device, the optimizer's DP gather, the
RNG states) and returns; a `BackgroundWrite` then writes the files while the next step's rollout and reference
run. Some of what it reads is live state (a host buffer the next optimizer step writes into), so nothing may
change it before the write is done: `fence_pending` waits for the write, and is called before anything that
changes the weights or the optimizer state (the worker's ``update_actor``), before the next save and before the
driver commits the step (`trainer_io.finish_pending_save`). A write that failed raises at the fence, naming the
step and the rank; its step is never committed, so the previous committed step stays the one a resume takes.

At most one write per process: `start` fences the previous one first. Standard library only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the writer reports each file: (the path being written or just written, True once it is complete)
Progress = Callable[[Path, bool], None]


class BackgroundWriteError(RuntimeError):
    """A background checkpoint write failed; the message names the step, the rank and the cause."""


@dataclass
class FenceResult:
    """What the fence saw: plain values, so a Ray worker can hand it to the driver."""

    step: int
    rank: int
    write_s: float  # the write's own duration (thread start to end)
    waited_s: float  # how long the fence blocked its caller
    files: int
    nbytes: int
    result: Any = None  # what the write returned (the rank's record)

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rank": self.rank,
            "write_s": self.write_s,
            "waited_s": self.waited_s,
            "files": self.files,
            "nbytes": self.nbytes,
        }


@dataclass
class _State:
    files: int = 0
    nbytes: int = 0
    current: Path | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class BackgroundWrite:
    """``write(progress)`` run in a daemon thread (a killed job leaves an uncommitted staging folder, never a
    committed step; a daemon thread never keeps a failing worker alive)."""

    def __init__(self, step: int, rank: int, write: Callable[[Progress], Any]) -> None:
        self.step, self.rank = int(step), int(rank)
        self._write = write
        self._state = _State()
        self._result: Any = None
        self._error: BaseException | None = None
        self._started = self._ended = 0.0
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-write-step-{step}", daemon=True)

    def _progress(self, path: Path, complete: bool) -> None:
        with self._state.lock:
            if complete:
                self._state.files += 1
                try:
                    self._state.nbytes += os.stat(path).st_size
                except OSError:
                    pass
                self._state.current = None
            else:
                self._state.current = Path(path)

    def _run(self) -> None:
        self._started = time.monotonic()
        try:
            self._result = self._write(self._progress)
        except BaseException as err:  # handed to the fence, which raises it in the caller's thread
            self._error = err
        finally:
            self._ended = time.monotonic()

    def start(self) -> BackgroundWrite:
        self._thread.start()
        return self

    @property
    def done(self) -> bool:
        return self._thread.ident is not None and not self._thread.is_alive()

    def bytes_so_far(self) -> int:
        """Bytes of the finished files plus what the file being written holds so far (its size on disk)."""
        with self._state.lock:
            done, current = self._state.nbytes, self._state.current
        try:
            return done + (os.stat(current).st_size if current is not None else 0)
        except OSError:
            return done

    def fence(self, poll_s: float = 1.0, on_wait: Callable[[int], None] | None = None) -> FenceResult:
        """Wait for the write; ``on_wait(bytes so far)`` every ``poll_s`` while it runs (a progress mark for hang
        diagnosis: the caller is waiting on the storage, not stuck). Raises `BackgroundWriteError` if it failed."""
        t0 = time.monotonic()
        while self._thread.is_alive():
            self._thread.join(timeout=poll_s)
            if self._thread.is_alive() and on_wait is not None:
                on_wait(self.bytes_so_far())
        waited = time.monotonic() - t0
        if self._error is not None:
            err = self._error
            first = str(err).splitlines()[0] if str(err) else ""
            raise BackgroundWriteError(
                f"checkpoint step {self.step}: rank {self.rank}'s background write failed: "
                f"{type(err).__name__}{': ' + first if first else ''}; the step is not committed"
            ) from err
        with self._state.lock:
            files, nbytes = self._state.files, self._state.nbytes
        return FenceResult(
            self.step, self.rank, self._ended - self._started, waited, files, nbytes, result=self._result
        )


_pending: BackgroundWrite | None = None
_pending_lock = threading.Lock()


def start(write: BackgroundWrite, on_wait: Callable[[int], None] | None = None) -> BackgroundWrite:
    """Start ``write`` as this process's one pending write, after fencing the previous one (if any)."""
    global _pending
    fence_pending(on_wait=on_wait)
    with _pending_lock:
        _pending = write.start()
    return write


def pending() -> BackgroundWrite | None:
    return _pending


def fence_pending(poll_s: float = 1.0, on_wait: Callable[[int], None] | None = None) -> FenceResult | None:
    """Wait for this process's pending write (None when there is none). The slot is cleared whether the write
    succeeded or not, so a failed write is reported once, by the fence that saw it."""
    global _pending
    with _pending_lock:
        write = _pending
    if write is None:
        return None
    try:
        return write.fence(poll_s=poll_s, on_wait=on_wait)
    finally:
        with _pending_lock:
            if _pending is write:
                _pending = None


__all__ = [
    "BackgroundWrite",
    "BackgroundWriteError",
    "FenceResult",
    "Progress",
    "fence_pending",
    "pending",
    "start",
]
