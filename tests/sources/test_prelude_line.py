"""The one inserted line: placed by parsing, idempotent, strippable to pristine bytes, checked by --verify."""

from __future__ import annotations

import ast
import hashlib
import json

import pytest

from sources_testlib import PRELUDE_LINE, REPO_ROOT, copy_real_root, run_setup
from verl_patches.sources import prelude_line
from verl_patches.sources.prelude_line import PreludeError

LINE = PRELUDE_LINE
REL = "verl/workers/megatron_workers.py"

# (source, index of the line the prelude must precede once inserted)
SAMPLES = {
    "long_docstring": (
        '# Copyright (c) someone\n'
        '#\n'
        '"""A module docstring that spans many lines.\n'
        '\n'
        'import os   <- looks like code, but is docstring text\n'
        'from x import y\n'
        '\n'
        'The end.\n'
        '"""\n'
        '\n'
        'import os\n'
        'import torch\n',
        10,
    ),
    "comments_first_no_docstring": (
        '#!/usr/bin/env python\n# -*- coding: utf-8 -*-\n# comment block\n\nimport logging\nx = 1\n',
        4,
    ),
    "no_docstring_code_first": ('x = 1\nimport os\n', 0),
    "future_imports": (
        '"""Doc."""\nfrom __future__ import annotations\nfrom __future__ import division\n\nimport os\n',
        4,
    ),
    "docstring_then_assignment": ('"""Doc."""\n\n__all__ = ["a"]\nimport os\n', 2),
    "single_quoted_docstring_one_line": ("'''Doc.'''\nimport os\n", 1),
    "multiline_first_import": ('"""D."""\nfrom os import (\n    path,\n    sep,\n)\n', 1),
}


@pytest.mark.parametrize("name", SAMPLES)
def test_insert_position_found_by_parsing(name):
    source, at = SAMPLES[name]
    out = prelude_line.insert(source.encode(), LINE).decode()
    lines = out.splitlines()
    assert lines[at] == LINE
    assert lines[:at] + lines[at + 1 :] == source.splitlines()
    # the inserted statement is the first one after the docstring and __future__ imports
    body = ast.parse(out).body
    i = 1 if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else 0
    while isinstance(body[i], ast.ImportFrom) and body[i].module == "__future__":
        i += 1
    assert ast.unparse(body[i]) == LINE
    assert ast.get_docstring(ast.parse(out)) == ast.get_docstring(ast.parse(source))


@pytest.mark.parametrize("name", SAMPLES)
def test_idempotent_and_strip_restores_pristine_bytes(name):
    source = SAMPLES[name][0].encode()
    once = prelude_line.insert(source, LINE)
    assert prelude_line.insert(once, LINE) == once
    assert prelude_line.find(once, LINE) != [] and len(prelude_line.find(once, LINE)) == 1
    assert prelude_line.is_in_place(once, LINE)
    assert not prelude_line.is_in_place(source, LINE)
    assert prelude_line.strip(once, LINE) == source
    assert prelude_line.strip(source, LINE) == source


def test_misplaced_or_duplicated_line_is_not_in_place_and_insert_repairs_it():
    source = SAMPLES["long_docstring"][0].encode()
    good = prelude_line.insert(source, LINE)
    duplicated = good + (LINE + "\n").encode()
    misplaced = source + (LINE + "\n").encode()
    for bad in (duplicated, misplaced):
        assert not prelude_line.is_in_place(bad, LINE)
        assert prelude_line.insert(bad, LINE) == good
        assert prelude_line.strip(bad, LINE) == source


def test_edge_files():
    assert prelude_line.insert(b"", LINE) == (LINE + "\n").encode()
    assert prelude_line.insert(b'"""Only a docstring."""\n', LINE) == f'"""Only a docstring."""\n{LINE}\n'.encode()
    no_newline = b'"""Doc."""'
    out = prelude_line.insert(no_newline, LINE)
    assert out == f'"""Doc."""\n{LINE}'.encode()
    assert prelude_line.is_in_place(out, LINE) and prelude_line.strip(out, LINE) == no_newline
    assert prelude_line.insert(out, LINE) == out
    crlf = b'"""Doc."""\r\nimport os\r\n'
    out = prelude_line.insert(crlf, LINE)
    assert prelude_line.find(out, LINE) == [1] and prelude_line.strip(out, LINE) == crlf


def test_unparsable_file_is_a_named_error():
    with pytest.raises(PreludeError, match=r"mw\.py:2: cannot parse"):
        prelude_line.insert(b'"""Doc."""\ndef (:\n', LINE, "mw.py")


# --------------------------------------------------------------------------- the real vendored file


def test_real_megatron_workers_has_the_line_once_and_strips_to_the_locked_bytes():
    path = REPO_ROOT / REL
    if not path.is_file():
        pytest.skip(f"{REL} absent: the repo root is not populated (run setup_sources.sh)")
    data = path.read_bytes()
    assert len(prelude_line.find(data, LINE)) == 1
    assert prelude_line.is_in_place(data, LINE, str(path))
    # right after the docstring, before the first import
    tree = ast.parse(data)
    assert isinstance(tree.body[0], ast.Expr) and ast.unparse(tree.body[1]) == LINE
    assert all(not isinstance(s, (ast.Import, ast.ImportFrom)) or s.lineno > tree.body[1].lineno for s in tree.body[2:])
    pristine = prelude_line.strip(data, LINE)
    manifest = json.loads((REPO_ROOT / "sources.manifests/verl.pypi.json").read_text())["files"]
    record = manifest["workers/megatron_workers.py"]
    assert record == f"- {hashlib.sha256(pristine).hexdigest()}"


@pytest.fixture
def verl_root(tmp_path):
    return copy_real_root(tmp_path / "root", ["verl"])


def _verify(root):
    return run_setup("--verify", "--only", "verl", lock=root / "sources.lock", root=root)


def test_verify_fails_when_the_line_is_missing_or_duplicated(verl_root):
    assert _verify(verl_root).rc == 0
    target = verl_root / REL
    good = target.read_bytes()

    target.write_bytes(prelude_line.strip(good, LINE))
    r = _verify(verl_root)
    assert r.rc == 1 and "MISMATCH" in r.out and REL in r.out

    target.write_bytes(good + (LINE + "\n").encode())
    r = _verify(verl_root)
    assert r.rc == 1 and "MISMATCH" in r.out and REL in r.out

    target.write_bytes(good)
    assert _verify(verl_root).rc == 0


def test_setup_puts_a_missing_line_back_without_network(verl_root):
    target = verl_root / REL
    good = target.read_bytes()
    target.write_bytes(prelude_line.strip(good, LINE))
    r = run_setup("--offline", "--only", "verl", lock=verl_root / "sources.lock", root=verl_root)
    assert r.rc == 0, r.text
    assert "prelude-inserted" in r.out
    assert target.read_bytes() == good
