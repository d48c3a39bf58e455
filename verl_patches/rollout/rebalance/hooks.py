"""Before/after hooks on an engine class's methods (LLM._run_engine, LLMEngine.step on A3), removable.

A hook never changes what the method returns unless it is an `after` hook that returns a value other
than None (used by recovery to hand back regrouped outputs).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

_ORIGINAL = "__rebalance_original__"


def before(cls: type, name: str, hook: Callable[..., None]) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        hook(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(wrapper, _ORIGINAL, original)
    setattr(cls, name, wrapper)


def after(cls: type, name: str, hook: Callable[..., Any]) -> None:
    original = getattr(cls, name)

    @functools.wraps(original)
    def wrapper(self, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        replaced = hook(self, result, *args, **kwargs)
        return result if replaced is None else replaced

    setattr(wrapper, _ORIGINAL, original)
    setattr(cls, name, wrapper)


def remove(cls: type, name: str) -> None:
    """Undo every hook on cls.name (innermost original restored)."""
    fn = cls.__dict__.get(name)
    while fn is not None and hasattr(fn, _ORIGINAL):
        fn = getattr(fn, _ORIGINAL)
    if fn is not None:
        setattr(cls, name, fn)


def is_hooked(cls: type, name: str) -> bool:
    return hasattr(cls.__dict__.get(name), _ORIGINAL)
