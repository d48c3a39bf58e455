"""The cache route: a directory of artifacts exported on a connected machine, for air-gapped clusters.

Layout: `sources-cache.json` plus the files it names. PyPI artifacts are copied as they are (checked
by the lock's sha256); git trees are stored as tars named by commit (checked by the lock's tree hash).
"""

from __future__ import annotations

import json
from pathlib import Path

from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.lock import Component

MANIFEST = "sources-cache.json"


def read_index(cache_dir: Path) -> dict:
    p = Path(cache_dir) / MANIFEST
    if not p.exists():
        raise RouteUnavailable(f"{cache_dir} has no {MANIFEST} (make one with --export-cache on a connected machine)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno})") from None
    if data.get("schema") != 1 or not isinstance(data.get("components"), dict):
        raise IntegrityError(f"{p}: expected {{'schema': 1, 'components': {{...}}}}")
    return data


def entry_for(cache_dir: Path, component: Component) -> tuple[str, Path, dict]:
    """(route the artifact came from, artifact path, entry) for a component, checked against the lock."""
    entry = read_index(cache_dir)["components"].get(component.name)
    if entry is None:
        raise RouteUnavailable(f"{Path(cache_dir) / MANIFEST} has no entry for {component.name}")
    path = Path(cache_dir) / entry["file"]
    if not path.exists():
        raise RouteUnavailable(f"{path} is listed in {MANIFEST} but missing")
    route = entry.get("route")
    if route == "git":
        if entry.get("commit") != component.commit:
            raise IntegrityError(f"{path.name}: exported from commit {entry.get('commit')}, the lock pins {component.commit}")
    elif route == "pypi":
        if component.pypi is None or entry.get("file") != component.pypi.file:
            raise IntegrityError(f"{path.name}: not the artifact the lock names for {component.name}")
    else:
        raise IntegrityError(f"{MANIFEST}: {component.name}: unknown route {route!r}")
    return route, path, entry


def write_index(cache_dir: Path, updates: dict[str, dict]) -> None:
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    p = cache_dir / MANIFEST
    data = json.loads(p.read_text(encoding="utf-8")) if p.exists() else {"schema": 1, "components": {}}
    data["components"].update(updates)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(p)
