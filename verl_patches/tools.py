"""Worker-side helpers of the vendor's tools.py (vendor item C8): a light cache release and memory logs.

* `empty_cache` prefers the device module's ``empty_virt_addr_cache`` (torch_npu with
  ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``): it unmaps cached virtual ranges without handing
  physical memory back to the driver; the vendor measured about 4 s per full ``empty_cache``, twice a step.
* `print_memory` logs used/free/total device memory at a checkpoint, only when ``PRINT_MEMORY=1``
  (the vendor's switch), by default on rank 0 only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from verl_patches import device
from verl_patches.base import env_registry

PRINT_MEMORY_ENV = "PRINT_MEMORY"
logger = logging.getLogger("verl_patches")


def empty_cache(module: Any | None = None) -> str:
    """Release cached device memory; returns the call made ("none" on the CPU). `module`: the device
    module to use (default: torch.npu / torch.cuda as `device` reports, None on the CPU)."""
    mod = device.accelerator_module() if module is None else module
    if mod is None:
        return "none"
    if callable(getattr(mod, "empty_virt_addr_cache", None)):
        mod.empty_virt_addr_cache()
        return "empty_virt_addr_cache"
    mod.empty_cache()
    return "empty_cache"


def _rank() -> int:
    try:
        # lazy: torch is heavy and only this path needs it; importing this module stays light
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank()
    except ImportError:
        pass
    return env_registry.integer("RANK", default=0)


def print_memory(
    tag: str, only_rank_0: bool = True, environ: Mapping[str, str] | None = None, rank: int | None = None
) -> str | None:
    """Log the memory line for `tag` when PRINT_MEMORY is on (and this is rank 0 unless `only_rank_0` is
    False); returns the line logged, or None."""
    if not env_registry.flag(PRINT_MEMORY_ENV, environ):
        return None
    r = _rank() if rank is None else rank
    if only_rank_0 and r != 0:
        return None
    line = f"[rank {r}] memory {device.memory_info().line(tag)}"
    logger.warning(line)
    return line
