"""MODULE_ALIAS patches: a stand-in module under a name whose real package is absent."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
import uuid

import pytest

from verl_patches.patching.declaration import Kind, Patch
from verl_patches.patching.registry import MARKER

STAND_IN = """
def unpad():
    return "ours"
"""


def alias(name, target, provides) -> Patch:
    return Patch(
        name=name,
        target=target,
        kind=Kind.MODULE_ALIAS,
        fingerprint="",
        vendor_item="G1",
        reason="test",
        provides=provides,
    )


@pytest.fixture
def absent_top():
    top = f"vpt_absent_{uuid.uuid4().hex[:8]}"
    yield top
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]


def test_alias_creates_parent_packages_with_specs(scratch, absent_top, make_registry):
    provides = scratch.write("stand_in", STAND_IN)
    target = f"{absent_top}.sub.padding"
    assert importlib.util.find_spec(absent_top) is None
    reg = make_registry([alias("al", target, provides)])
    rec = reg.records[0]
    assert rec.status == "applied" and rec.detail == f"{target} is {provides}"
    assert rec.created_modules == [absent_top, f"{absent_top}.sub", target]

    ours = sys.modules[provides]
    assert sys.modules[target] is ours
    assert importlib.import_module(target) is ours
    ns: dict = {}
    exec(f"from {target} import unpad", ns)
    assert ns["unpad"]() == "ours"
    exec(f"import {target} as m", ns)
    assert ns["m"] is ours

    # The created parents are proper packages: find_spec works (no "__spec__ is None" ValueError) and
    # attribute access walks down to the stand-in.
    top_spec = importlib.util.find_spec(absent_top)
    assert top_spec is not None and top_spec.name == absent_top and top_spec.submodule_search_locations == []
    assert importlib.util.find_spec(f"{absent_top}.sub").name == f"{absent_top}.sub"
    top = sys.modules[absent_top]
    assert top.sub.padding is ours
    assert getattr(top, MARKER) == "al" and getattr(ours, MARKER) == "al"


def test_alias_revert_removes_what_it_created(scratch, absent_top, make_registry):
    provides = scratch.write("stand_in", STAND_IN)
    target = f"{absent_top}.padding"
    reg = make_registry([alias("al", target, provides)])
    assert target in sys.modules
    reg.revert()
    assert absent_top not in sys.modules and target not in sys.modules
    assert importlib.util.find_spec(absent_top) is None


def test_alias_not_needed_when_the_real_package_exists(scratch, make_registry):
    provides = scratch.write("stand_in", STAND_IN)
    real_sub = scratch.write("real_sub", "REAL = True\n")
    # The real top-level package is importable (even though not imported yet): leave it alone.
    scratch.forget()
    reg = make_registry([alias("al", f"{scratch.package}.other_sub", provides)])
    assert reg.records[0].status == "not-needed"
    assert reg.records[0].detail == f"the real {scratch.package} is installed"
    assert f"{scratch.package}.other_sub" not in sys.modules
    assert importlib.import_module(real_sub).REAL


def test_alias_not_needed_when_the_target_is_already_imported(scratch, absent_top, make_registry):
    provides = scratch.write("stand_in", STAND_IN)
    hand_made = types.ModuleType(absent_top)  # e.g. a fake installed by a test or another shim: no __spec__
    sys.modules[absent_top] = hand_made
    reg = make_registry([alias("al", absent_top, provides)])
    assert reg.records[0].status == "not-needed"
    assert sys.modules[absent_top] is hand_made


def test_alias_twice_and_second_registry_are_no_ops(scratch, absent_top, make_registry):
    provides = scratch.write("stand_in", STAND_IN)
    target = f"{absent_top}.padding"
    first = make_registry([alias("al", target, provides)])
    module = sys.modules[target]
    second = make_registry([alias("al", target, provides)])
    assert second.records[0].status == "applied"
    assert second.records[0].detail.startswith("already in place")
    assert sys.modules[target] is module
    second.revert()  # created nothing, so removes nothing
    assert sys.modules[target] is module
    first.revert()
    assert target not in sys.modules


def test_attribute_patch_on_our_stand_in_is_not_needed(scratch, absent_top, make_registry):
    """Replacing an attribute of our own (lazy) stand-in would only import its dependencies early."""
    provides = scratch.write("stand_in", STAND_IN)
    target = f"{absent_top}.optimizers"
    called = []
    reg = make_registry(
        [
            alias("al", target, provides),
            Patch(
                name="attr",
                target=f"{target}:unpad",
                kind=Kind.REPLACE,
                fingerprint="",
                vendor_item="G2",
                reason="test",
                replacement=lambda: called.append(1),
            ),
        ]
    )
    assert [r.status for r in reg.records] == ["applied", "not-needed"]
    assert reg.records[1].detail == f"{target} is our stand-in (patch al)"
    assert called == []
    assert sys.modules[target].unpad() == "ours"
