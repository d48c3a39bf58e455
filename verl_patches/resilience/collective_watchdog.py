"""Detect a collective that a peer never joins, and say which rank, which collective and which step.

A stuck HCCL peer (or a gloo one on CPU) otherwise leaves 255 ranks waiting silently until the backend's own
time-out, with a message that names no rank. Here every watched torch.distributed collective records, per
process group, how many collectives this rank has entered and which one it is in; a daemon thread publishes
that to the job's rendezvous store once per `poll_s` (so a live process keeps a heartbeat even while its main
thread is blocked), and when this rank has waited longer than the time-out it reads its group's statuses,
names the ranks holding it up (hang_diagnosis.blame) and ends the process with `EXIT_HANG`, so the launcher
and the driver see a failed worker instead of a silent job.

Configured by `VERL_PATCHES_COLLECTIVE_TIMEOUT_S` (seconds; unset or 0 = off); the trainer step comes from
`set_step`. Point-to-point ops and the `.wait()` of asynchronous collectives are not watched: they show up as
the next watched collective that the blocked rank never enters.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import threading
import time
from typing import Any, Callable

from verl_patches.resilience.hang_diagnosis import Hang, RankStatus, group_key, hang_message

TIMEOUT_ENV = "VERL_PATCHES_COLLECTIVE_TIMEOUT_S"
EXIT_HANG = 86
STORE_PREFIX = "verl_patches/collective_watchdog"
WATCHED_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
                       "barrier", "all_to_all_single", "all_to_all", "reduce", "gather", "scatter",
                       "reduce_scatter", "all_gather_object", "broadcast_object_list", "gather_object")


def configured_timeout() -> float:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: expected a number of seconds") from None
    if value < 0:
        raise ValueError(f"{TIMEOUT_ENV}={raw!r}: must be >= 0")
    return value


class CollectiveWatchdog:
    def __init__(self, rank: int, store: Any, timeout_s: float, poll_s: float | None = None,
                 on_hang: Callable[[str], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.rank, self.store, self.timeout_s = rank, store, timeout_s
        self.poll_s = poll_s if poll_s is not None else max(0.2, min(5.0, timeout_s / 10))
        self.heartbeat_timeout_s = max(3 * self.poll_s, timeout_s / 2)
        self.on_hang = on_hang or _exit_with_message
        self.clock = clock
        self._lock = threading.Lock()
        self._step: int | None = None
        self._entered: dict[str, int] = {}
        self._inflight: tuple[str, str, list[int], int, float] | None = None  # op, group, members, seq, since
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="collective-watchdog", daemon=True)

    def start(self) -> "CollectiveWatchdog":
        self._publish()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def set_step(self, step: int) -> None:
        with self._lock:
            self._step = int(step)

    def enter(self, op: str, members: list[int]) -> None:
        key = group_key(members)
        with self._lock:
            seq = self._entered.get(key, 0) + 1
            self._entered[key] = seq
            self._inflight = (op, key, members, seq, self.clock())

    def leave(self) -> None:
        with self._lock:
            self._inflight = None

    def status(self) -> RankStatus:
        with self._lock:
            cur, since = "", None
            if self._inflight:
                op, key, _, seq, since = self._inflight
                cur = f"{op} #{seq} on group [{key}]"
            return RankStatus(self.rank, self._step, self.clock(), dict(self._entered), cur, since)

    def check_once(self) -> str | None:
        """Publish this rank's status; if its current collective is over time, the message naming the culprits.

        When the store is unreachable (its host, rank 0, may itself have ended after reporting the hang), an
        over-time collective is still reported, with the reason the peers could not be asked."""
        store_error = None
        try:
            self._publish()
        except Exception as e:
            store_error = e
        with self._lock:
            inflight, step = self._inflight, self._step
        if inflight is None:
            return None
        op, key, members, seq, since = inflight
        waited = self.clock() - since
        if waited < self.timeout_s:
            return None
        hang = Hang(op, key, seq, step, waited)
        if store_error is None:
            try:
                statuses = {r: self._read(r) for r in members if r != self.rank}
                return hang_message(self.rank, hang, members, statuses, self.clock(), self.heartbeat_timeout_s)
            except Exception as e:
                store_error = e
        return (hang_message(self.rank, hang, [self.rank], {}, self.clock(), self.heartbeat_timeout_s).split(";")[0]
                + f"; the peers' status could not be read (the job's store is unreachable: {store_error})")

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            message = self.check_once()
            if message:
                self.on_hang(message)
                return

    def _publish(self) -> None:
        st = self.status()
        self.store.set(f"{STORE_PREFIX}/{self.rank}", json.dumps(
            {"step": st.step, "heartbeat": st.heartbeat, "entered": st.entered, "current": st.current,
             "current_since": st.current_since}))

    def _read(self, rank: int) -> RankStatus | None:
        key = f"{STORE_PREFIX}/{rank}"
        if not self.store.check([key]):
            return None
        d = json.loads(self.store.get(key))
        return RankStatus(rank, d["step"], d["heartbeat"], {k: int(v) for k, v in d["entered"].items()},
                          d["current"], d["current_since"])


def _exit_with_message(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
    # rank 0 hosts the job's store: stay a moment so that peers timing out together can still read it
    time.sleep(_EXIT_GRACE_S)
    os._exit(EXIT_HANG)


_EXIT_GRACE_S = 3.0


_WATCHDOG: CollectiveWatchdog | None = None
_INSTALL_LOCK = threading.Lock()


def active() -> CollectiveWatchdog | None:
    """The process's watchdog, started on first use once torch.distributed is up and a time-out is set."""
    global _WATCHDOG
    if _WATCHDOG is not None:
        return _WATCHDOG
    timeout = configured_timeout()
    if not timeout:
        return None
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    with _INSTALL_LOCK:
        if _WATCHDOG is None:
            store = dist.distributed_c10d._get_default_store()
            _WATCHDOG = CollectiveWatchdog(dist.get_rank(), store, timeout).start()
    return _WATCHDOG


def set_step(step: int) -> None:
    """Called by the workers at each trainer step, so a hang report says which step it happened in."""
    wd = active()
    if wd is not None:
        wd.set_step(step)


def watched(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """WRAP replacement factory for torch.distributed.<op>: signature-preserving, a pass-through when off."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            wd = active()
            if wd is None or _is_async(sig, args, kwargs):
                return fn(*args, **kwargs)
            wd.enter(op, _members(sig, args, kwargs))
            try:
                return fn(*args, **kwargs)
            finally:
                wd.leave()

        wrapper.__verl_patches_watched__ = op
        return wrapper

    return wrap


def _bound(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, Any]:
    try:
        return sig.bind_partial(*args, **kwargs).arguments
    except TypeError:
        return {}


def _is_async(sig: inspect.Signature, args: tuple, kwargs: dict) -> bool:
    return bool(_bound(sig, args, kwargs).get("async_op", False))


def _members(sig: inspect.Signature, args: tuple, kwargs: dict) -> list[int]:
    import torch.distributed as dist

    group = _bound(sig, args, kwargs).get("group")
    if group is None:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def watch_collective(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The WRAP replacement of every watched torch.distributed collective (named after the function)."""
    return watched(fn.__name__)(fn)
