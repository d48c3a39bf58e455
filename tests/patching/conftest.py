"""Fixtures for the patching tests (helpers live in patching_testlib.py)."""

from __future__ import annotations

import sys
import uuid

import pytest

from patching_testlib import Scratch
from verl_patches.patching import import_hook
from verl_patches.patching.registry import Registry


@pytest.fixture
def scratch(tmp_path, monkeypatch) -> Scratch:
    """A throwaway package `vpt_<random>` importable for this test only."""
    pkg = f"vpt_{uuid.uuid4().hex[:10]}"
    root = tmp_path / "src"
    (root / pkg).mkdir(parents=True)
    (root / pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    s = Scratch(pkg, root)
    yield s
    s.forget()


@pytest.fixture
def make_registry():
    """Build and activate Registry objects; every one is reverted (hook removed) after the test."""
    made: list[Registry] = []

    def make(patches, device: str = "cpu", activate: bool = True) -> Registry:
        reg = Registry(list(patches), device)
        made.append(reg)
        return reg.activate() if activate else reg

    yield make
    for reg in reversed(made):
        if reg.active:
            reg.revert()
        import_hook.uninstall(reg._hook)
    assert not any(h is reg._hook for reg in made for h in sys.meta_path)
