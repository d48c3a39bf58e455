"""vLLM 0.9.1's `get_num_blocks` logs "Overriding num_gpu_blocks=N with num_gpu_blocks_override=M" and returns N.

The override (`num_gpu_blocks_override`, an engine argument) is the only way to give the KV cache a fixed
size instead of what memory profiling leaves. The tiny run needs it: its emulated npu device's memory is the
host's, so profiling would hand each of its four engines most of the host's memory. Here the function returns
the override when one is set, as its own log line says it does; without one, the original's count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def wrap_get_num_blocks(original: Callable[..., int]) -> Callable[..., int]:
    """`get_num_blocks` that returns `cache_config.num_gpu_blocks_override` when it is set."""

    @functools.wraps(original)
    def get_num_blocks(vllm_config: Any, num_layers: int, available_memory: int, page_size: int) -> int:
        counted = original(vllm_config, num_layers, available_memory, page_size)
        override = vllm_config.cache_config.num_gpu_blocks_override
        return counted if override is None else int(override)

    return get_num_blocks
