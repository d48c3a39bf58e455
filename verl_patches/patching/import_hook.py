"""Run a callback right after a module of interest finishes executing, before anyone imports from it.

Patches whose target module is not imported yet wait here, so activating the overlay never imports
heavy upstream modules itself, and a later `from target import f` already sees the patched object.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType

# Loaders made per file: wrapping one instance's exec_module affects only that module.
_PER_MODULE_LOADERS = (importlib.machinery.SourceFileLoader, importlib.machinery.SourcelessFileLoader)


class PostImportHook(importlib.abc.MetaPathFinder):
    def __init__(self, watched: Callable[[str], bool], callback: Callable[[ModuleType], None]) -> None:
        self.watched = watched
        self.callback = callback
        self._local = threading.local()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:  # importlib's MetaPathFinder protocol
        if not self.watched(fullname):
            return None
        busy = getattr(self._local, "busy", None)
        if busy is None:
            busy = self._local.busy = set()
        if fullname in busy:
            return None
        busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        finally:
            busy.discard(fullname)
        if spec is not None and isinstance(spec.loader, _PER_MODULE_LOADERS):
            original = spec.loader.exec_module
            callback = self.callback

            def exec_module(module: ModuleType, _original: Callable[[ModuleType], None] = original) -> None:
                _original(module)
                callback(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install(hook: PostImportHook) -> None:
    if hook not in sys.meta_path:
        sys.meta_path.insert(0, hook)


def uninstall(hook: PostImportHook) -> None:
    while hook in sys.meta_path:
        sys.meta_path.remove(hook)
