"""The driver never waits for a worker group without a bound.

verl's worker-group methods end in ``ray.get`` on one result per worker (``func_generator`` in
``verl.single_controller.ray.base``), which waits forever for a worker that stopped: a SIGSTOPped,
swapped-out or stuck process, or one whose peers wait for it. Our ``func_generator`` is upstream's with
that ``ray.get`` replaced by `wait_for_workers`: it collects the results as they come (each deserialised
once, as before), and between looks it reads the outstanding workers' heartbeats (`call_watch.CallWatch`).

* When no outstanding worker has made progress for the time-out (`timeout.TIMEOUT_ENV`), it names them
  (rank, node, pid, phase, step, micro-batch; its log file), asks torch_npu's HCCL flight recorder of every
  live rank to dump when the workers have it on, kills the group's actors (``ray.kill``; a stopped process,
  which cannot exit by itself, gets SIGKILL on its node: `reap`) and raises `WorkerHangError` with that one
  line: the trainer ends with a non-zero status and the launcher repeats the line last.
* When a worker process dies (Ray lost its actor), it names that worker with its last position at once.
* A worker's own exception is raised as soon as it arrives, as upstream's ``ray.get`` would raise it, unless an
  outstanding worker turns out to have died within `DEATH_GRACE_S`: a dead peer makes the others' collectives
  fail (gloo: "Connection reset by peer"; HCCL: a remote rank gone), often before Ray reports the death itself,
  and the death is the cause to name.

With the time-out unset this is upstream's ``ray.get``.
"""

from __future__ import annotations

import logging
import struct
import time
from datetime import timedelta
from typing import Any

from verl_patches.resilience import reap
from verl_patches.resilience.boards import RayKVBoard
from verl_patches.resilience.call_watch import CallWatch
from verl_patches.resilience.hang_diagnosis import Diagnosis, death_message, hang_message
from verl_patches.resilience.timeout import configured_timeout, publish_interval
from verl_patches.worker_calls.meta_keys import STEP_META_KEY

logger = logging.getLogger("verl_patches")

FLIGHT_RECORDER_SIGNAL = "exception_dump"  # torch_npu's key: its monitor threads dump when it appears
FLIGHT_RECORDER_GRACE_S = 20.0  # torch_npu polls the key every TORCH_HCCL_COORD_CHECK_MILSEC (1 s), then dumps
FLIGHT_RECORDER_TOOL = "torch_npu's tools/flight_recorder/fr_trace.py"
DEATH_GRACE_S = 10.0  # after a worker's exception, how long a peer's death may take to be reported by Ray

_driver_step: int | None = None


class WorkerHangError(RuntimeError):
    """A worker call made no progress for the time-out, or a worker process died; the message names who."""


def set_step(step: int | None) -> None:
    """The trainer step the driver is in (our fit loop sets it), for calls whose payload carries none."""
    global _driver_step
    _driver_step = step


def func_generator(
    self: Any, method_name: str, dispatch_fn: Any, collect_fn: Any, execute_fn: Any, blocking: bool
) -> Any:
    """verl v0.4.0's ``func_generator`` with a bounded wait for the workers' results."""
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.protocol import DataProto, _padding_size_key

    class Functor:
        def __call__(this, *args: Any, **kwargs: Any) -> Any:
            step = _payload_step(args, kwargs)
            args, kwargs = dispatch_fn(self, *args, **kwargs)
            padding_count = kwargs.pop(_padding_size_key, 0)
            output = execute_fn(method_name, *args, **kwargs)
            if blocking:
                output = wait_for_workers(self, method_name, output, step)
            output = collect_fn(self, output)
            if padding_count > 0:
                if isinstance(output, DataProto):
                    indices = [i for i in range(len(output))][:-padding_count]
                    output = output.select_idxs(indices)
                elif isinstance(output, list):
                    output = output[:-padding_count]
            return output

    # a class named after the method, as upstream, so Ray's and our logs name it
    return type(method_name, (Functor,), {})()


def _payload_step(args: tuple, kwargs: dict) -> int | None:
    for value in (*args, *kwargs.values()):
        meta = getattr(value, "meta_info", None)
        if isinstance(meta, dict) and meta.get(STEP_META_KEY) is not None:
            return int(meta[STEP_META_KEY])
    return _driver_step


def wait_for_workers(group: Any, method: str, refs: Any, step: int | None = None) -> Any:
    """``ray.get(refs)`` for a worker group's call, bounded by the time-out (see the module docstring)."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    timeout = configured_timeout()
    single = isinstance(refs, ray.ObjectRef)
    ref_list = [refs] if single else list(refs) if isinstance(refs, list) else None
    workers = list(getattr(group, "_workers", []) or [])
    if not timeout or ref_list is None or not ref_list:
        return ray.get(refs)
    if single:
        handles = workers[:1]
    elif len(ref_list) == len(workers):
        handles = workers
    else:  # not one result per worker: no way to tell whose is missing
        return ray.get(refs)
    keys = [h._actor_id.hex() for h in handles]
    watch = CallWatch(
        method,
        step if step is not None else _driver_step,
        {k: f"worker {i} of the group" for i, k in enumerate(keys)},
        timeout,
        RayKVBoard(),
        lookup=ray_actor_states,
    )
    results: dict[str, Any] = {}
    pending = dict(zip(keys, ref_list))
    by_ref = {r: k for k, r in pending.items()}
    interval = publish_interval(timeout)
    while pending:
        ready, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=interval)
        died: list[tuple[str, Exception]] = []
        failed: list[tuple[str, Exception]] = []
        _collect(ready, by_ref, pending, results, died, failed)
        if failed and not died and pending:  # was it a peer's death that made this worker fail?
            deadline = time.monotonic() + DEATH_GRACE_S
            while pending and not died and time.monotonic() < deadline:
                more, _ = ray.wait(list(pending.values()), num_returns=1, timeout=deadline - time.monotonic())
                _collect(more, by_ref, pending, results, died, failed)
        if died:
            watch.observe([k for k, _ in died])  # their last heartbeats
            error = type(died[0][1]).__name__
            if failed:
                error += f"; {len(failed)} other worker(s) failed after it: {_last_line(failed[0][1])}"
            message = death_message(watch.call, watch.step, watch.observed([k for k, _ in died]), error)
            end_job(workers, message, None, watch)
        if failed:
            raise failed[0][1]
        if pending:
            diagnosis = watch.observe(list(pending))
            if diagnosis is not None:
                end_job(workers, hang_message(diagnosis, flight_recorder_note(watch, list(pending))), diagnosis, watch)
    return results[keys[0]] if single else [results[k] for k in keys]


def _collect(
    ready: list[Any],
    by_ref: dict[Any, str],
    pending: dict[str, Any],
    results: dict[str, Any],
    died: list[tuple[str, Exception]],
    failed: list[tuple[str, Exception]],
) -> None:
    """Take the finished results: a value, a dead worker (Ray lost its actor) or a worker's own exception."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    for ref in ready:
        key = by_ref[ref]
        del pending[key]
        try:
            results[key] = ray.get(ref)
        except ray.exceptions.RayActorError as e:
            died.append((key, e))
        except Exception as e:  # the worker's own exception: raised once no peer's death explains it
            failed.append((key, e))


def _last_line(error: Exception, limit: int = 200) -> str:
    """The last line of an error's text (a worker's error carries its remote traceback before it)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[-1] if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def ray_actor_states(actor_ids: list[str]) -> dict[str, dict]:
    """Ray's actor table (GCS, no dashboard needed) for workers that have not published a heartbeat yet."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    from ray._private import state

    out = {}
    for actor_id in actor_ids:
        info = state.actors(actor_id=actor_id) or {}
        if info:
            out[actor_id] = {
                "state": info.get("State", "?"),
                "node": info.get("Address", {}).get("IPAddress", "?"),
                "pid": info.get("Pid", "?"),
            }
    return out


def flight_recorder_note(watch: CallWatch, keys: list[str]) -> str:
    """Where torch_npu's HCCL flight recorder dumps, when the workers run with it (empty otherwise)."""
    records = [watch.seen[k].record for k in keys if watch.seen[k].record]
    paths = [r["flight_recorder"] for r in records if r.get("flight_recorder")]
    if not paths:
        return ""
    prefix = paths[0].rstrip("0123456789")
    return (
        f"HCCL flight recorder dump requested from every live rank: {prefix}<rank> on each node, Python "
        f"stacks in {prefix}<rank>_py_traceback (read them with {FLIGHT_RECORDER_TOOL})"
    )


def end_job(workers: list[Any], message: str, diagnosis: Diagnosis | None, watch: CallWatch) -> None:
    """Say who, let the flight recorder dump, stop every worker of the group, raise `WorkerHangError`."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    print(message, flush=True)
    logger.error(message)
    if diagnosis is not None:
        _request_flight_recorder_dump(watch, diagnosis)
    for w in workers:
        try:
            ray.kill(w, no_restart=True)
        except Exception as e:  # already gone
            logger.debug("ray.kill(%s): %s", w, e)
    # ray.kill asks a process to exit; a stopped one never does: those whose heartbeat stopped get SIGKILL
    silent = [s.record for s in watch.seen.values() if s.record and watch.clock() - s.beat_at >= watch.stale_s]
    try:
        reap.kill_processes(silent)
    except Exception as e:
        logger.error("could not end the stopped worker processes %s: %s", [r.get("pid") for r in silent], e)
    raise WorkerHangError(message)


def _request_flight_recorder_dump(watch: CallWatch, diagnosis: Diagnosis) -> None:
    """Set torch_npu's dump signal in the job's rendezvous store, then give the live ranks time to dump."""
    records = [s.record for s in watch.seen.values() if s.record]
    if not any(r.get("flight_recorder") for r in records):
        return
    store = next((r["store"] for r in records if r.get("store")), None)
    if store is None:
        return
    culprit = diagnosis.culprit_ranks[0] if diagnosis.culprit_ranks else -1
    try:
        signal_flight_recorder(store, culprit)
    except Exception as e:
        logger.error("could not signal the HCCL flight recorder dump through %s: %s", store, e)
        return
    time.sleep(FLIGHT_RECORDER_GRACE_S)


def signal_flight_recorder(store_address: str, culprit_rank: int, timeout_s: float = 10.0) -> None:
    """torch_npu 2.5.1's coordinated dump: every rank's monitor thread (TORCH_HCCL_ENABLE_MONITORING=1,
    TORCH_HCCL_DUMP_ON_TIMEOUT=1) checks this key of the default group's store and dumps when it exists."""

    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch.distributed as dist

    host, _, port = store_address.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    store.set(FLIGHT_RECORDER_SIGNAL, struct.pack("=i", culprit_rank))
