"""Per-file hash manifests of each component's pristine tree, per route, committed beside the lock.

The lock holds one tree hash per route; these files hold the per-file records that hash combines, so an
error can name exactly which files differ without any network or cache. They hold hashes only, no
upstream code.
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_patches.base.atomic_write import write_json_atomically
from verl_patches.sources.treehash import FileHashes, combine

MANIFEST_DIR_NAME = "sources.manifests"


def manifest_path(lock_path: Path, component: str, route: str) -> Path:
    return Path(lock_path).parent / MANIFEST_DIR_NAME / f"{component}.{route}.json"


def load_manifest(lock_path: Path, component: str, route: str) -> FileHashes | None:
    p = manifest_path(lock_path, component, route)
    if not p.exists():
        return None
    return json.loads(p.read_text(encoding="utf-8"))["files"]


def save_manifest(lock_path: Path, component: str, route: str, files: FileHashes) -> Path:
    p = manifest_path(lock_path, component, route)
    p.parent.mkdir(parents=True, exist_ok=True)
    body = {"component": component, "route": route, "tree_sha256": combine(files), "files": dict(sorted(files.items()))}
    write_json_atomically(p, body, indent=0)
    return p
