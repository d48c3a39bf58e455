"""Content hash of a package folder: sorted relative paths, exec bits and file contents.

The same definition is used for every route, so a folder built from git, from PyPI or from an offline
cache can be compared with the lock without knowing where it came from.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

SKIP_DIRS = {"__pycache__"}
SKIP_SUFFIXES = (".pyc", ".pyo")

FileHashes = dict[str, str]  # relative posix path -> "<mode> <sha256>"


def iter_files(root: Path) -> Iterator[tuple[str, os.DirEntry]]:
    """Yield (relative posix path, entry) for every file and symlink under root, unsorted."""
    stack = [(root, "")]
    while stack:
        base, prefix = stack.pop()
        with os.scandir(base) as it:
            for entry in it:
                rel = f"{prefix}{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    if entry.name not in SKIP_DIRS:
                        stack.append((Path(entry.path), rel + "/"))
                elif not entry.name.endswith(SKIP_SUFFIXES):
                    yield rel, entry


def file_record(entry: os.DirEntry, content_filter: Callable[[bytes], bytes] | None = None) -> str:
    st = entry.stat(follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        return "l " + hashlib.sha256(os.readlink(entry.path).encode()).hexdigest()
    with open(entry.path, "rb") as f:
        data = f.read()
    if content_filter is not None:
        data = content_filter(data)
    mode = "x" if st.st_mode & stat.S_IXUSR else "-"
    return f"{mode} {hashlib.sha256(data).hexdigest()}"


def file_hashes(root: Path, filters: dict[str, Callable[[bytes], bytes]] | None = None) -> FileHashes:
    """Per-file records of a folder; `filters` maps a relative path to a content transform applied first."""
    filters = filters or {}
    return {rel: file_record(e, filters.get(rel)) for rel, e in iter_files(Path(root))}


def combine(records: FileHashes) -> str:
    h = hashlib.sha256()
    for rel in sorted(records):
        h.update(f"{records[rel]} {rel}\n".encode())
    return h.hexdigest()


def tree_hash(root: Path, filters: dict[str, Callable[[bytes], bytes]] | None = None) -> str:
    return combine(file_hashes(root, filters))


def compare(expected: FileHashes, found: FileHashes) -> dict[str, list[str]]:
    """Which files were changed, added or removed going from `expected` to `found`."""
    return {
        "changed": sorted(p for p in expected.keys() & found.keys() if expected[p] != found[p]),
        "added": sorted(found.keys() - expected.keys()),
        "removed": sorted(expected.keys() - found.keys()),
    }
