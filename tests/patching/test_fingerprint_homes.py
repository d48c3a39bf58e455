"""One fingerprint per upstream object, written once: a re-pin changes one line.

Every fingerprint literal in the catalog (the declaration modules and `upstream_fingerprints`) is read
from the source, so a copy pasted into a second declaration is refused even when the two still agree.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections import defaultdict
from pathlib import Path

import pytest

from verl_patches.patches import catalog, upstream_fingerprints
from verl_patches.patches.catalog import all_patches
from verl_patches.patches.upstream_fingerprints import UPSTREAM_FINGERPRINTS, pinned
from verl_patches.patching.declaration import Kind, Patch

LITERAL = re.compile(r"^sha256:[0-9a-f]{16}$")


def _catalog_files() -> list[Path]:
    files = [Path(importlib.import_module(m).__file__) for m in catalog.DECLARATION_MODULES]
    return files + [Path(upstream_fingerprints.__file__)]


def literal_sites(files: list[Path]) -> dict[str, list[str]]:
    """fingerprint literal -> ["file:line", ...] where it is written."""
    sites: dict[str, list[str]] = defaultdict(list)
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and LITERAL.match(node.value):
                sites[node.value].append(f"{path.name}:{node.lineno}")
    return sites


def pins_by_object(patches: list[Patch]) -> dict[tuple[str, ...], dict[str, list[str]]]:
    """Fingerprinted sources (one object, or several fingerprinted together) -> {value: [patch names]}."""
    pins: dict[tuple[str, ...], dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for p in patches:
        if LITERAL.match(p.fingerprint):
            pins[p.fingerprint_targets][p.fingerprint].append(p.name)
        for relied, fp in p.relies_on:
            pins[(relied,)][fp].append(f"{p.name} (relies_on)")
    return pins


def test_no_fingerprint_literal_is_written_twice():
    repeated = {fp: where for fp, where in literal_sites(_catalog_files()).items() if len(where) > 1}
    assert repeated == {}, (
        "a fingerprint written in more than one place: give the upstream object one entry in "
        f"verl_patches/patches/upstream_fingerprints.py and read it with pinned(...): {repeated}"
    )


def test_each_upstream_object_has_one_fingerprint():
    conflicting = {objs: dict(values) for objs, values in pins_by_object(all_patches()).items() if len(values) > 1}
    assert conflicting == {}


def test_every_shared_entry_is_used_and_the_lookup_names_what_is_missing():
    used = set(pins_by_object(all_patches()))
    keys = {k if isinstance(k, tuple) else (k,) for k in UPSTREAM_FINGERPRINTS}
    assert keys - used == set(), "entries no declaration pins"
    assert pinned("verl.trainer.ppo.metric_utils:compute_throughout_metrics") == "sha256:60a463364a4e1d69"
    with pytest.raises(KeyError, match=r"python -m verl_patches.patching.fingerprint verl.x:y"):
        pinned("verl.x:y")


def test_the_checks_see_a_copied_literal_and_a_second_value(tmp_path):
    """The two checks above on a catalog that has each defect (they must not pass vacuously)."""
    a = tmp_path / "a_declarations.py"
    b = tmp_path / "b_declarations.py"
    a.write_text('P = dict(fingerprint="sha256:0123456789abcdef")\n')
    b.write_text('Q = ["sha256:0123456789abcdef", "sha256:fedcba9876543210"]\n')
    assert literal_sites([a, b]) == {
        "sha256:0123456789abcdef": ["a_declarations.py:1", "b_declarations.py:1"],
        "sha256:fedcba9876543210": ["b_declarations.py:1"],
    }

    def patch(name: str, fp: str, **kw) -> Patch:
        return Patch(
            name=name,
            target="pkg.m:f",
            kind=Kind.WRAP,
            fingerprint=fp,
            vendor_item="local",
            reason="t",
            replacement=lambda o: o,
            **kw,
        )

    pins = pins_by_object(
        [
            patch("one", "sha256:0123456789abcdef"),
            patch("two", "sha256:fedcba9876543210"),
            patch("three", "", relies_on=(("pkg.m:f", "sha256:0123456789abcdef"),)),
        ]
    )
    assert dict(pins[("pkg.m:f",)]) == {
        "sha256:0123456789abcdef": ["one", "three (relies_on)"],
        "sha256:fedcba9876543210": ["two"],
    }
