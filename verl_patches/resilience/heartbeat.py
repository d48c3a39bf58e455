"""A side thread that publishes this process's progress (`progress.py`) while its main thread works or
is blocked (a gloo wait, an HCCL stream sync, ``.item()``, a stuck kernel): a frozen or dead process stops
publishing, a live one keeps its heartbeat moving whatever its main thread does.

Each beat is one small JSON value under the process's key on a board (`boards.py`): who it is (rank,
node, pid, its log file), its position, a beat counter, an activity counter and, once its position has
not moved for two beats, where its main thread is (innermost frames). Activity: while the position is
coarse (a phase with no inner progress points, e.g. the vLLM engine's decode loop on NPU), every change of
the main thread's stack between two beats counts, so a long generation that keeps running is told from a
main thread that stays in one place. All of it costs the main thread nothing but the GIL for a few tens
of microseconds per beat.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import sysconfig
import threading
from pathlib import Path
from typing import Any

from verl_patches.base import env_registry
from verl_patches.resilience import fault_injection, progress
from verl_patches.resilience.boards import Board, RayKVBoard, StoreBoard
from verl_patches.resilience.reap import start_ticks
from verl_patches.resilience.timeout import configured_timeout, publish_interval

STACK_DEPTH = 12  # frames of the main thread compared for activity
WHERE_FRAMES = 2  # frames named in the report
FLIGHT_RECORDER_DEFAULT = "/tmp/hccl_trace_rank_"  # torch_npu 2.5.1's TORCH_HCCL_DEBUG_INFO_TEMP_FILE default
_STDLIB = sysconfig.get_paths()["stdlib"] + "/"


class Heartbeat:
    def __init__(
        self, board: Board, key: str, identity: dict[str, Any], interval_s: float, main_ident: int | None = None
    ) -> None:
        self.board, self.key, self.identity, self.interval_s = board, key, dict(identity), interval_s
        self.main_ident = main_ident if main_ident is not None else threading.main_thread().ident
        self.beats = 0
        self.activity = 0
        self.errors = 0
        self._last_stack: tuple | None = None
        self._last_marks = -1
        self._still = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="verl-patches-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.beat()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def beat(self) -> dict[str, Any]:
        """Publish once; returns what was published."""
        pos, age = progress.current()
        self._still = self._still + 1 if pos.marks == self._last_marks else 0
        self._last_marks = pos.marks
        where = ""
        if pos.coarse or self._still >= 2:
            stack = self._main_stack()
            if pos.coarse and self._last_stack is not None and stack != self._last_stack:
                self.activity += 1
            self._last_stack = stack if pos.coarse else None
            if self._still >= 2:
                where = describe_stack(stack)
        else:
            self._last_stack = None
        self.beats += 1
        payload = {
            **self.identity,
            "beat": self.beats,
            "activity": self.activity,
            "age_s": round(age, 3),
            "pos": pos.to_dict(),
            "where": where,
        }
        self.board.publish(self.key, json.dumps(payload))
        return payload

    def _main_stack(self) -> tuple:
        frame = sys._current_frames().get(self.main_ident)
        out = []
        while frame is not None and len(out) < STACK_DEPTH:
            code = frame.f_code
            out.append((code.co_filename, frame.f_lineno, code.co_name))
            frame = frame.f_back
        return tuple(out)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # the board's host may be gone while the job ends; keep trying until then
                self.errors += 1


def describe_stack(stack: tuple) -> str:
    """'megatron/core/pipeline_parallel/schedules.py:123 forward_step <- ...' (innermost first), past the
    standard library's frames (a lock's or an event's wait says little; its caller says where)."""
    own = [f for f in stack if not f[0].startswith(_STDLIB)] or list(stack)
    parts = []
    for filename, line, name in own[:WHERE_FRAMES]:
        short = "/".join(Path(filename).parts[-3:])
        parts.append(f"{short}:{line} {name}")
    return " <- ".join(parts)


def process_identity(rank: int, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Who publishes: rank, node address, host name and Ray node id, pid and start time (for `reap`), its log
    file, where torch_npu's flight recorder would dump, and the job's rendezvous store (torch_npu's dump
    signal lives there)."""

    env = os.environ if environ is None else environ
    ident: dict[str, Any] = {
        "rank": rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "node": _node_ip(),
        "log": _log_file(),
        "started": start_ticks(),
    }
    node_id = _node_id()
    if node_id:
        ident["node_id"] = node_id
    if env_registry.flag("TORCH_HCCL_DUMP_ON_TIMEOUT", env) and env_registry.flag("TORCH_HCCL_ENABLE_MONITORING", env):
        ident["flight_recorder"] = (env.get("TORCH_HCCL_DEBUG_INFO_TEMP_FILE") or FLIGHT_RECORDER_DEFAULT) + str(rank)
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        ident["store"] = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    return ident


def _node_ip() -> str:
    try:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    return "127.0.0.1"


def _node_id() -> str | None:
    try:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except Exception:
        pass
    return None


def _log_file() -> str:
    """The file this process's stdout goes to (Ray redirects a worker's to its session's logs folder)."""
    try:
        target = os.readlink("/proc/self/fd/1")
    except OSError:
        return ""
    return target if target.startswith("/") else ""


_ACTIVE: Heartbeat | None = None
_START_LOCK = threading.Lock()


def active() -> Heartbeat | None:
    return _ACTIVE


def start_in_ray_worker() -> Heartbeat | None:
    """In a Ray actor of a worker group, once per process, when the time-out is set: publish under the
    actor's id (the driver knows its workers by their actor handles) and arm fault injection if asked."""
    global _ACTIVE
    timeout = configured_timeout()
    if not timeout or _ACTIVE is not None:
        return _ACTIVE
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    actor_id = ray.get_runtime_context().get_actor_id() if ray.is_initialized() else None
    if actor_id is None:
        return None
    rank = env_registry.integer("RANK", default=-1)
    with _START_LOCK:
        if _ACTIVE is None:
            _ACTIVE = Heartbeat(RayKVBoard(), actor_id, process_identity(rank), publish_interval(timeout)).start()
            fault_injection.arm(rank, before_stop=_ACTIVE.beat)
    return _ACTIVE


def start_with_store(store: Any, rank: int, timeout_s: float | None = None) -> Heartbeat | None:
    """In a plain torch.distributed process: publish to the job's store under ``rank<rank>``."""
    global _ACTIVE
    timeout = configured_timeout() if timeout_s is None else timeout_s
    if not timeout:
        return None
    with _START_LOCK:
        if _ACTIVE is None:
            _ACTIVE = Heartbeat(
                StoreBoard(store), f"rank{rank}", process_identity(rank), publish_interval(timeout)
            ).start()
            fault_injection.arm(rank, before_stop=_ACTIVE.beat)
    return _ACTIVE


def stop_active() -> None:
    """Stop and forget the process's heartbeat (tests)."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
    _ACTIVE = None
