"""Progress points of verl's workers for hang diagnosis (`verl_patches.resilience.progress`).

* `with_call_progress`: a worker call (generate, ref, old log-prob, update, init, checkpoint save/load)
  enters its phase with the trainer step our fit loop writes into its ``meta_info``
  (`step_payloads.STEP_META_KEY`; a call without it keeps the last step), and leaves it when it returns;
* `with_micro_batch_progress`: every micro-batch that Megatron's forward/backward schedule takes from
  verl's batch iterator is one unit, numbered within its batch (`make_batch_generator` builds the
  iterator in every forward/backward of ref, old log-prob and update);
* `start_heartbeat`: every verl worker process publishes its progress from a side thread.

Each is a handful of attribute writes per call or per micro-batch; with the time-out unset the heartbeat
does not start and the marks are only written, never read.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

from verl_patches.resilience import progress
from verl_patches.resilience.heartbeat import start_in_ray_worker
from verl_patches.worker_calls.meta_keys import STEP_META_KEY


def step_of(data: Any) -> int | None:
    meta = getattr(data, "meta_info", None) or {}
    step = meta.get(STEP_META_KEY) if isinstance(meta, dict) else None
    return None if step is None else int(step)


def with_call_progress(method: Callable, name: str | None = None) -> Callable:
    """`name`: the worker method's name (upstream's GPUMemoryLogger hides it: its wrapper is called ``f``)."""
    name = name or method.__name__
    phase = progress.CALL_PHASES.get(name, name)

    @functools.wraps(method)  # keeps verl's dispatch registration attributes
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        progress.enter_call(name, step_of(args[0] if args else next(iter(kwargs.values()), None)), phase)
        try:
            return method(self, *args, **kwargs)
        finally:
            progress.leave_call()

    return wrapper


def _for(name: str) -> Callable[[Callable], Callable]:
    def factory(method: Callable) -> Callable:
        return with_call_progress(method, name)

    factory.__name__ = factory.__qualname__ = f"{name}_progress"
    return factory


# the declared WRAP factories, one per worker method (megatron_declarations)
generate_sequences_progress = _for("generate_sequences")
compute_ref_log_prob_progress = _for("compute_ref_log_prob")
compute_log_prob_progress = _for("compute_log_prob")
update_actor_progress = _for("update_actor")
init_model_progress = _for("init_model")
save_checkpoint_progress = _for("save_checkpoint")
load_checkpoint_progress = _for("load_checkpoint")


class _MicroBatches:
    """Marks one unit each time the schedule takes a micro-batch."""

    __slots__ = ("_it", "_n", "_total")

    def __init__(self, it: Iterator, total: int | None) -> None:
        self._it, self._n, self._total = it, 0, total

    def __iter__(self) -> _MicroBatches:
        return self

    def __next__(self) -> Any:
        item = next(self._it)
        self._n += 1
        progress.unit("micro-batch", self._n, self._total)
        return item


def with_micro_batch_progress(make_batch_generator: Callable) -> Callable:
    @functools.wraps(make_batch_generator)
    def wrapper(batches: Any, vpp_size: int) -> Any:
        out = make_batch_generator(batches, vpp_size)
        total = len(batches) if hasattr(batches, "__len__") else None
        progress.begin_group()
        if isinstance(out, list):  # one iterator per virtual pipeline chunk: only the first one counts
            return [_MicroBatches(out[0], total)] + out[1:] if out else out
        return _MicroBatches(out, total)

    return wrapper


def start_heartbeat(init: Callable) -> Callable:
    """verl's ``Worker.__init__``, then this process's heartbeat (once per process; off without time-out)."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)

        start_in_ray_worker()

    return __init__
