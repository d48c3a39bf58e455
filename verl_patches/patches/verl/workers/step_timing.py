"""Measure the train -> rollout switch (weights resharded into the inference engine) on the workers and
hand it to the driver with the generated batch, so the step table can show it next to generation.

The sharding manager's `__enter__` is where verl moves the trained weights into the rollout engine
(and, on the Megatron path, where our reshard runs); its duration is kept on the manager and copied
into the output's meta_info by the generate_sequences wrapper.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from verl_patches.worker_calls.meta_keys import TIMING_META_KEY

ATTR = "_verl_patches_enter_s"


def timed_enter(enter: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(enter)
    def __enter__(self: Any) -> Any:
        start = time.perf_counter()
        try:
            return enter(self)
        finally:
            setattr(self, ATTR, time.perf_counter() - start)

    return __enter__


def report_switch_time(generate: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(generate)  # keeps verl's dispatch/execute registration attributes
    def generate_sequences(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = generate(self, *args, **kwargs)
        manager = getattr(self, "rollout_sharding_manager", None) or getattr(self, "sharding_manager", None)
        switch = getattr(manager, ATTR, None)
        if switch is not None and hasattr(output, "meta_info"):
            output.meta_info.setdefault(TIMING_META_KEY, {})["reshard"] = float(switch)
        return output

    return generate_sequences
