"""verl.trainer.main_ppo.run_ppo: start Ray with our runtime environment before verl does."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from verl_patches.device import device_kind
from verl_patches.patching.ray_runtime import ray_init_kwargs

logger = logging.getLogger("verl_patches")


def start_ray_with_overlay(run_ppo: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(run_ppo)
    def wrapper(config: Any, *args: Any, **kwargs: Any) -> Any:
        # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
        import ray

        if not ray.is_initialized():
            ray.init(**ray_init_kwargs(config, device_kind()))
        else:
            logger.warning(
                "Ray was started before run_ppo: workers get our patches only if that ray.init passed "
                "runtime_env=verl_patches.patching.ray_runtime.runtime_env()"
            )
        return run_ppo(config, *args, **kwargs)

    return wrapper
