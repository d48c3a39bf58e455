"""CPU port of verl.single_controller.ray.base: worker groups on a CPU host use Ray's GPU slots.

verl names the Ray resource after the device ("GPU" for cuda, "NPU" for npu) and asks for a custom
"cpu" resource otherwise, which no Ray cluster offers, so placement never happens. On a CPU host our
Ray start declares logical GPU slots (one per worker); this makes the worker group ask for them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def ray_device_for_cpu(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("device_name") == "cpu":
            kwargs["device_name"] = "cuda"  # Ray resource naming only; the workers still compute on the CPU
        init(self, *args, **kwargs)

    return __init__
