"""CPU port of verl.workers.fsdp_workers: start the process group on gloo before verl picks hccl.

verl initialises torch.distributed with "cpu:gloo,cuda:nccl" when CUDA is present and otherwise with
"cpu:gloo,npu:hccl" (or "hccl"), which does not exist on a CPU host. Initialising first, with the same
rank and world size from the environment, makes verl's own `if not is_initialized()` skip its call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base import env_registry
from verl_patches.device import dist_backend


def init_process_group_first(init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        # lazy: torch is heavy and only this path needs it; importing this module stays light
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group(
                backend=dist_backend(),
                rank=env_registry.integer("RANK", default=0),
                world_size=env_registry.integer("WORLD_SIZE", default=1),
            )
        init(self, *args, **kwargs)

    return __init__
