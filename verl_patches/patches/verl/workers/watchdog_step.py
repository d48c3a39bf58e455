"""Tell the process's collective watchdog which trainer step a worker call belongs to.

Our fit loop writes the step into every worker call's ``meta_info`` (`step_payloads.STEP_META_KEY`); the
wrapper hands it to `collective_watchdog.set_step` before the method runs, so a hang inside generate, ref
or update is reported with its step. A call without the key (validation, verl's own loop) keeps the last
step. With the watchdog off (`VERL_PATCHES_COLLECTIVE_TIMEOUT_S` unset) this costs one dictionary lookup.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from verl_patches.trainer.step_payloads import STEP_META_KEY


def step_of(data: Any) -> int | None:
    meta = getattr(data, "meta_info", None) or {}
    step = meta.get(STEP_META_KEY)
    return None if step is None else int(step)


def with_watchdog_step(method: Callable) -> Callable:
    @functools.wraps(method)  # keeps verl's dispatch registration attributes
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        step = step_of(args[0] if args else next(iter(kwargs.values()), None))
        if step is not None:
            from verl_patches.resilience import collective_watchdog

            collective_watchdog.set_step(step)
        return method(self, *args, **kwargs)

    return wrapper
