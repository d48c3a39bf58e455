"""``update_actor`` fenced by the worker's pending background checkpoint write (issue 42).

The update never starts while a write reads the state it is about to change, whoever calls it: the driver fences
first (`verl_patches.driver.checkpoint_fence.finish_pending_save`); upstream's own fit loop would not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.driver.checkpoint_fence import fence_in_worker


def fence_before_update(original: Callable) -> Callable:
    """``update_actor`` that first waits for this worker's pending checkpoint write."""

    @functools.wraps(original)  # keeps verl's dispatch registration attributes
    def update_actor(self: Any, *args: Any, **kwargs: Any) -> Any:
        fence_in_worker(self)
        return original(self, *args, **kwargs)

    return update_actor
