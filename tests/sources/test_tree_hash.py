"""Tree hash: what counts (paths, contents, exec bit, symlink targets) and what does not (order, caches)."""

from __future__ import annotations

import os
import shutil

import pytest

from sources_testlib import V1_FILES, V1_LINKS, reference_tree_hash, write_tree
from verl_patches.sources.treehash import compare, file_hashes, tree_hash


@pytest.fixture
def tree(tmp_path):
    return write_tree(tmp_path / "t", V1_FILES, V1_LINKS)


def test_matches_the_definition_written_out_independently(tree):
    assert tree_hash(tree) == reference_tree_hash(tree)
    records = file_hashes(tree)
    assert set(records) == set(V1_FILES) | set(V1_LINKS)
    assert records["bin/run.sh"].startswith("x ") and records["data/table.txt"].startswith("- ")
    assert records["link.txt"].startswith("l ")


def test_content_change(tree):
    before = tree_hash(tree)
    (tree / "data/table.txt").write_bytes(b"a,b\n1,2 \n")
    assert tree_hash(tree) != before


def test_exec_bit_counts_other_permission_bits_do_not(tree):
    before = tree_hash(tree)
    os.chmod(tree / "data/table.txt", 0o664)  # group write: not part of the hash
    assert tree_hash(tree) == before
    os.chmod(tree / "data/table.txt", 0o744)  # owner exec: part of it
    assert tree_hash(tree) != before
    os.chmod(tree / "data/table.txt", 0o644)
    os.chmod(tree / "bin/run.sh", 0o644)
    assert tree_hash(tree) != before


def test_path_counts(tree):
    before = tree_hash(tree)
    (tree / "data/table.txt").rename(tree / "data/table2.txt")
    assert tree_hash(tree) != before
    (tree / "data/table2.txt").rename(tree / "table.txt")  # same name, other folder
    assert tree_hash(tree) != before
    (tree / "table.txt").rename(tree / "data/table.txt")
    assert tree_hash(tree) == before


def test_caches_are_ignored(tree):
    before = tree_hash(tree)
    cache = tree / "workers/__pycache__"
    cache.mkdir()
    (cache / "mw.cpython-311.pyc").write_bytes(b"\x00compiled")
    (cache / "notes.txt").write_bytes(b"anything inside __pycache__")
    (tree / "stray.pyc").write_bytes(b"\x00")
    (tree / "stray.pyo").write_bytes(b"\x00")
    assert tree_hash(tree) == before
    (tree / "stray.py").write_bytes(b"")  # a real (empty) file does count
    assert tree_hash(tree) != before


def test_symlinks_are_hashed_by_target_not_followed(tree):
    before = tree_hash(tree)
    # the link's target content changes -> only the target file's record changes, not the link's
    records = file_hashes(tree)
    (tree / "data/table.txt").write_bytes(b"changed\n")
    after = file_hashes(tree)
    assert after["link.txt"] == records["link.txt"] and after["data/table.txt"] != records["data/table.txt"]
    (tree / "data/table.txt").write_bytes(V1_FILES["data/table.txt"][0])
    assert tree_hash(tree) == before
    # a different target text changes the hash
    (tree / "link.txt").unlink()
    os.symlink("./data/table.txt", tree / "link.txt")
    assert tree_hash(tree) != before
    # a regular file holding the same bytes as the target is not the same as the link
    (tree / "link.txt").unlink()
    shutil.copyfile(tree / "data/table.txt", tree / "link.txt")
    assert tree_hash(tree) != before
    # a symlink to a folder is a link record, not descended into
    (tree / "link.txt").unlink()
    os.symlink("data/table.txt", tree / "link.txt")
    os.symlink("data", tree / "datalink")
    assert set(file_hashes(tree)) == set(V1_FILES) | {"link.txt", "datalink"}
    assert file_hashes(tree)["datalink"].startswith("l ")


def test_independent_of_creation_order_root_name_and_mtimes(tmp_path):
    a = write_tree(tmp_path / "a", V1_FILES, V1_LINKS)
    reversed_files = dict(reversed(list(V1_FILES.items())))
    b = write_tree(tmp_path / "other-name", reversed_files, V1_LINKS)
    os.utime(b / "data/table.txt", (1, 1))
    assert tree_hash(a) == tree_hash(b)


def test_compare_names_changed_added_removed(tree):
    before = file_hashes(tree)
    (tree / "data/table.txt").write_bytes(b"x")
    (tree / "extra.py").write_bytes(b"")
    (tree / "bin/run.sh").unlink()
    assert compare(before, file_hashes(tree)) == {
        "changed": ["data/table.txt"],
        "added": ["extra.py"],
        "removed": ["bin/run.sh"],
    }
