"""The driver's fence of background checkpoint writes (issue 42): every worker's pending write waited for, then
the commit.

The worker's ``save_checkpoint`` (`patches.verl.utils.checkpoint.megatron_worker`) takes its snapshot and starts
the write (`verl_patches.checkpoint.background_write`) when the driver asks for ``background=True``; everything
here waits for that write:

* `fence_in_worker`: inside a worker, wait for its pending write (none: returns at once), marking progress for
  hang diagnosis while the storage is busy; what the driver reads back is `FenceResult.to_dict`. The driver
  runs it on each worker (`fence_workers`); the declared wrap of ``update_actor``
  (`patches.verl.utils.checkpoint.background_save`) runs it before every update, whoever calls it;
* `finish_pending_save` (the fit loop, before ``update_actor`` and at the end of the run): every worker's fence,
  then the commit (`trainer_io.commit_pending`): the step's manifest is written, the folder renamed and the
  tracker advanced only after every rank's write finished and its record was checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from verl_patches.checkpoint import background_write, trainer_io
from verl_patches.resilience import progress, worker_deadline

FENCE_CALL = "checkpoint_fence"  # how the hang report names the driver's wait for the workers' writes
MB = 1 << 20


def _mark_written(state: dict[str, int]) -> Callable[[int], None]:
    """A progress mark each time the write has grown (a stalled storage makes no progress: a hang)."""

    def on_wait(nbytes: int) -> None:
        if nbytes != state.get("last"):
            state["last"] = nbytes
            progress.unit("MB written", nbytes // MB)

    return on_wait


def fence_in_worker(_worker: Any = None) -> dict[str, Any] | None:
    """This process's pending checkpoint write, waited for (run inside a worker; `_worker` is the actor instance
    Ray's ``__ray_call__`` passes). None when there was none; a failed write raises, naming step and rank."""
    if background_write.pending() is None:
        return None
    progress.enter_call(FENCE_CALL, None, "save_checkpoint")
    try:
        result = background_write.fence_pending(on_wait=_mark_written({}))
    finally:
        progress.leave_call()
    return result.to_dict() if result is not None else None


def fence_workers(worker_group: Any, step: int | None) -> list[dict[str, Any]]:
    """Every worker's `fence_in_worker`, waited for without end only when hang diagnosis is off (the bound is
    `worker_deadline`'s, read from the workers' progress)."""
    workers = getattr(worker_group, "_workers", None)
    if not workers:  # not Ray workers (tests, fakes): the worker group's own processes are this one
        found = fence_in_worker()
        return [found] if found is not None else []
    refs = [w.__ray_call__.remote(fence_in_worker) for w in workers]
    return [r for r in worker_deadline.wait_for_workers(worker_group, FENCE_CALL, refs, step) if r is not None]


def finish_pending_save(trainer: Any) -> dict[str, float]:
    """Wait for the background write of the step saved last (if any) on every worker and commit it; returns
    the step's checkpoint metrics (empty when nothing was pending)."""
    pending = trainer_io.pending_save(trainer)
    if pending is None:
        return {}
    t0 = time.monotonic()
    try:
        results = fence_workers(trainer.actor_rollout_wg, pending.step)
    except BaseException:
        trainer_io.abandon_pending(trainer)  # never committed: its staging folder is pruned as a leftover
        raise
    waited = time.monotonic() - t0
    return trainer_io.commit_pending(trainer, results, waited)
