"""Worker processes that judge answers under a hard per-item wall-clock deadline.

Why processes: verl may call the reward from a worker thread (signals only work in a main thread)
and sympy can sit inside one C-level big-integer operation that no signal interrupts. A process can
always be killed, so every symbolic judgement here has a hard bound.

Why plain subprocesses (`python -m verl_patches.reward.grading_worker`) rather than multiprocessing:
spawn/forkserver re-import the caller's `__main__` in every child (an unguarded user script would
run again), forkserver's preload list is process-global state, and daemonic processes may not use
multiprocessing children at all. A subprocess has none of these problems. Start-up (about a second:
sympy and math-verify are imported) is paid once per worker; a killed worker's replacement starts
at once, in the background, so it is usually ready before it is needed.

The pool is thread-safe: each concurrent caller leases its own workers.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

from verl_patches.reward.grading_worker import READY, Verdict

logger = logging.getLogger(__name__)

# The directory that holds the verl_patches package, so workers import it whatever their cwd.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class PoolConfig:
    max_workers: int = max(1, min(32, os.cpu_count() or 1))
    memory_limit_mb: int | None = 4096
    start_timeout_s: float = 120.0
    # The worker stops itself at this fraction of the deadline, so most overruns keep the worker
    # alive; the parent kills it only when it has not answered by the deadline itself (> 1 disables
    # the worker's own timer, leaving only the kill).
    soft_deadline_fraction: float = 0.8


class WorkerStartError(RuntimeError):
    """A grading worker process could not be started."""


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    paths = [_PACKAGE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


class _Worker:
    """One grading subprocess: started without waiting, ready once it has sent READY."""

    def __init__(self, config: PoolConfig):
        request_read, request_write = os.pipe()
        response_read, response_write = os.pipe()
        command = [sys.executable, "-m", "verl_patches.reward.grading_worker"]
        command += ["--in-fd", str(request_read), "--out-fd", str(response_write)]
        if config.memory_limit_mb:
            command += ["--memory-limit-mb", str(config.memory_limit_mb)]
        try:
            self.process = subprocess.Popen(
                command, pass_fds=(request_read, response_write), env=_worker_env(), stdin=subprocess.DEVNULL
            )
        except OSError as exc:
            os.close(request_write)
            os.close(response_read)
            raise WorkerStartError(f"cannot start a reward grading worker: {exc}") from exc
        finally:
            os.close(request_read)
            os.close(response_write)
        self.requests = Connection(request_write, readable=False)
        self.responses = Connection(response_read, writable=False)
        self.ready = False
        self.start_deadline = time.monotonic() + config.start_timeout_s

    def accept_ready(self) -> None:
        """Read the READY message (call when `responses` is readable)."""
        try:
            message = self.responses.recv()
        except (EOFError, OSError) as exc:
            code = self.process.poll()
            raise WorkerStartError(f"reward grading worker exited during start-up (exit code {code})") from exc
        if message != READY:
            raise WorkerStartError(f"unexpected start-up message from a reward grading worker: {message!r}")
        self.ready = True

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.responses.poll(max(0.0, self.start_deadline - time.monotonic())):
            raise WorkerStartError("reward grading worker did not become ready in time")
        self.accept_ready()

    def send(self, job_id: int, pred: str, truth: str, soft_timeout_s: float) -> None:
        self.requests.send((job_id, pred, truth, soft_timeout_s))

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        self.requests.close()
        self.responses.close()

    def stop(self) -> None:
        try:
            self.requests.send(None)
            self.process.wait(timeout=1)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            pass
        self.kill()


class GuardedPool:
    def __init__(self, config: PoolConfig = PoolConfig()):
        self.config = config
        self._idle: list[_Worker] = []  # started, possibly not ready yet
        self._live = 0
        self._cond = threading.Condition()
        self._closed = False
        self._job_ids = itertools.count()

    # -- worker bookkeeping -------------------------------------------------------------------
    def _take(self, block: bool, wait_until: float | None = None) -> _Worker | None:
        """An idle worker or a newly started one; None when none is free (non-blocking or too late)."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the reward grading pool is closed")
                if self._idle:
                    ready = [w for w in self._idle if w.ready]
                    worker = ready[-1] if ready else self._idle[-1]
                    self._idle.remove(worker)
                    return worker
                if self._live < self.config.max_workers:
                    self._live += 1
                    break
                if not block:
                    return None
                remaining = None if wait_until is None else wait_until - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)
        try:
            return _Worker(self.config)
        except BaseException:
            with self._cond:
                self._live -= 1
                self._cond.notify()
            raise

    def _give_back(self, worker: _Worker) -> None:
        with self._cond:
            if not self._closed:
                self._idle.append(worker)
                self._cond.notify()
                return
            self._live -= 1
        worker.stop()

    def _discard(self, worker: _Worker, replace: bool) -> None:
        """Kill worker; with replace, start its successor now so it is ready when next needed."""
        worker.kill()
        with self._cond:
            self._live -= 1
            self._cond.notify()
            if not replace or self._closed:
                return
            self._live += 1
        try:
            successor = _Worker(self.config)
        except WorkerStartError:
            with self._cond:
                self._live -= 1
            return
        self._give_back(successor)

    # -- judging ------------------------------------------------------------------------------
    def judge(self, pred: str, truth: str, timeout_s: float) -> Verdict:
        """One judgement within timeout_s; waiting for a worker's start-up is not counted."""
        started = time.monotonic()
        try:
            worker = self._take(block=True, wait_until=started + timeout_s)
        except WorkerStartError as exc:
            logger.error("%s; the answer scores 0", exc)
            return Verdict.ERROR
        if worker is None:
            return Verdict.TIMEOUT
        startup_began = time.monotonic()
        try:
            worker.wait_ready()
        except WorkerStartError as exc:
            logger.error("%s; the answer scores 0", exc)
            self._discard(worker, replace=False)
            return Verdict.ERROR
        deadline = started + timeout_s + (time.monotonic() - startup_began)
        try:
            worker.send(
                next(self._job_ids), pred, truth, (deadline - time.monotonic()) * self.config.soft_deadline_fraction
            )
            if worker.responses.poll(max(0.0, deadline - time.monotonic())):
                _, verdict = worker.responses.recv()
                self._give_back(worker)
                return Verdict(verdict)
        except (EOFError, OSError, ValueError):
            self._discard(worker, replace=True)
            return Verdict.ERROR
        self._discard(worker, replace=True)
        return Verdict.TIMEOUT

    def judge_many(self, pairs: Sequence[tuple[str, str]], timeout_s: float, progress: bool = False) -> list[Verdict]:
        """Judge (pred, truth) pairs on up to max_workers workers, each pair within timeout_s."""
        # lazy: only this path needs tqdm; importing this module stays light
        from tqdm import tqdm

        results: list[Verdict | None] = [None] * len(pairs)
        queue = deque(range(len(pairs)))
        busy: dict[Connection, tuple[_Worker, int, float]] = {}
        starting: dict[Connection, _Worker] = {}
        free: list[_Worker] = []
        wanted = min(self.config.max_workers, len(pairs))
        start_failures = 0
        bar = tqdm(total=len(pairs), desc="symbolic reward checks", file=sys.stderr, disable=not progress)

        def adopt(worker: _Worker) -> None:
            if worker.ready:
                free.append(worker)
            else:
                starting[worker.responses] = worker

        try:
            while queue or busy:
                try:
                    while queue and len(busy) + len(starting) + len(free) < wanted:
                        worker = self._take(block=False)
                        if worker is None:
                            break
                        adopt(worker)
                    if not (busy or starting or free):
                        # Other threads hold every worker: wait for one (their deadlines bound this).
                        adopt(self._take(block=True))
                except WorkerStartError as exc:
                    start_failures += 1
                    logger.error("%s", exc)
                while queue and free:
                    worker, index = free.pop(), queue.popleft()
                    pred, truth = pairs[index]
                    try:
                        worker.send(index, pred, truth, timeout_s * self.config.soft_deadline_fraction)
                    except (OSError, ValueError):
                        self._discard(worker, replace=True)
                        queue.appendleft(index)
                        continue
                    busy[worker.responses] = (worker, index, time.monotonic() + timeout_s)
                if start_failures > max(3, wanted) and not (busy or starting or free):
                    logger.error("no reward grading worker could be started; %d answers score 0", len(queue))
                    for index in queue:
                        results[index] = Verdict.ERROR
                    queue.clear()
                    break
                if not (busy or starting):
                    continue
                deadlines = [deadline for _, _, deadline in busy.values()] + [
                    w.start_deadline for w in starting.values()
                ]
                for conn in wait(list(busy) + list(starting), timeout=max(0.0, min(deadlines) - time.monotonic())):
                    if conn in starting:
                        worker = starting.pop(conn)
                        try:
                            worker.accept_ready()
                            free.append(worker)
                        except WorkerStartError as exc:
                            start_failures += 1
                            logger.error("%s", exc)
                            self._discard(worker, replace=False)
                        continue
                    worker, index, _ = busy.pop(conn)
                    try:
                        _, verdict = conn.recv()
                    except (EOFError, OSError):
                        results[index] = Verdict.ERROR
                        self._discard(worker, replace=True)
                    else:
                        results[index] = Verdict(verdict)
                        free.append(worker)
                    bar.update(1)
                now = time.monotonic()
                for conn, (worker, index, deadline) in list(busy.items()):
                    if deadline <= now:
                        del busy[conn]
                        results[index] = Verdict.TIMEOUT
                        self._discard(worker, replace=True)
                        bar.update(1)
                for conn, worker in list(starting.items()):
                    if worker.start_deadline <= now:
                        del starting[conn]
                        start_failures += 1
                        logger.error("reward grading worker did not become ready in time")
                        self._discard(worker, replace=False)
        finally:
            bar.close()
            for worker, _, _ in busy.values():
                self._discard(worker, replace=False)
            for worker in list(starting.values()) + free:
                self._give_back(worker)
        return [verdict if verdict is not None else Verdict.ERROR for verdict in results]

    def warm_up(self, workers: int = 1) -> None:
        """Start workers and wait until they are ready, ahead of the first judgement."""
        taken: list[_Worker] = []
        try:
            for _ in range(min(workers, self.config.max_workers)):
                worker = self._take(block=False)
                if worker is None:
                    break
                taken.append(worker)
            for worker in taken:
                worker.wait_ready()
        finally:
            for worker in taken:
                self._give_back(worker)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._live -= len(idle)
        for worker in idle:
            worker.stop()


_default_lock = threading.Lock()
_default_pools: dict[PoolConfig, GuardedPool] = {}
_default_pid: int | None = None


def default_pool(config: PoolConfig = PoolConfig()) -> GuardedPool:
    """The process-wide pool for config, created on first use (and again in a forked child)."""
    global _default_pid
    with _default_lock:
        if _default_pid != os.getpid():
            # Pools inherited through fork() hold the parent's pipes: never use them here.
            _default_pools.clear()
            _default_pid = os.getpid()
        pool = _default_pools.get(config)
        if pool is None:
            pool = _default_pools[config] = GuardedPool(config)
            atexit.register(pool.close)
        return pool
