"""The real torch.compile, kept recoverable across MindSpeed's process-wide swap.

MindSpeed-LLM's adaptor sets `torch.compile = torch.jit.script` when it is imported (so Megatron's
jit_fuser functions get scripted, not compiled). The rollout (vLLM / TorchAir graph mode) needs the
real torch.compile. `initialize_megatron` captures the real one before the adaptor runs and restores
it afterwards; `real_torch_compile()` / `mindspeed_compile()` switch explicitly around a block.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

_REAL: Callable[..., Any] | None = None


def capture_real_compile() -> Callable[..., Any]:
    """Remember torch.compile as it is now, unless it is already MindSpeed's substitute."""
    global _REAL
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    if _REAL is None and not _is_substitute(torch.compile):
        _REAL = torch.compile
    if _REAL is None:
        raise RuntimeError(
            "torch.compile was replaced (by MindSpeed) before verl_patches could capture the real "
            "one: call initialize_megatron before anything imports mindspeed_llm"
        )
    return _REAL


def _is_substitute(fn: Any) -> bool:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    return fn is torch.jit.script or getattr(fn, "__module__", "").startswith(("mindspeed", "mindspeed_llm"))


def restore_real_compile() -> None:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    torch.compile = capture_real_compile()


@contextlib.contextmanager
def real_torch_compile() -> Iterator[None]:
    """The real torch.compile inside the block (the rollout), whatever was set outside."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    real, before = capture_real_compile(), torch.compile
    torch.compile = real
    try:
        yield
    finally:
        torch.compile = before


@contextlib.contextmanager
def mindspeed_compile() -> Iterator[None]:
    """MindSpeed's substitute (torch.jit.script) inside the block, e.g. while training code is first built."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    capture_real_compile()
    before = torch.compile
    torch.compile = torch.jit.script
    try:
        yield
    finally:
        torch.compile = before
