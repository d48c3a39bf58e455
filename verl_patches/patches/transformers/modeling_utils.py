"""Attention implementation where flash-attn is not installed: eager instead of an import error.

verl v0.4.0 asks transformers for attn_implementation="flash_attention_2" unconditionally when it
builds actor, critic and reward models. Without the flash-attn package transformers refuses to load
the model; on the CPU we fall back to the eager implementation, which every model class has.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("verl_patches")


def flash_attn_installed() -> bool:
    try:
        importlib.metadata.version("flash_attn")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def eager_without_flash_attn(autoset: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(autoset)
    def _autoset_attn_implementation(cls: Any, config: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(config, "_attn_implementation_internal", None) == "flash_attention_2" and not flash_attn_installed():
            logger.info("flash_attention_2 requested but flash-attn is not installed: using eager attention")
            config._attn_implementation_internal = "eager"
        return autoset(cls, config, *args, **kwargs)

    return _autoset_attn_implementation
