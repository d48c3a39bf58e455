"""The cache route: a directory of artifacts exported on a connected machine, for air-gapped clusters.

Layout: `sources-cache.json` plus the files it names. PyPI artifacts are copied as they are (checked
by the lock's sha256); git trees are stored as tars named by commit (checked by the lock's tree hash).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from verl_patches.base.atomic_write import write_json_atomically
from verl_patches.sources import names
from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.lock import HEX64, Component
from verl_patches.sources.pypi_route import sha256_file

MANIFEST = "sources-cache.json"


def read_index(cache_dir: Path) -> dict:
    p = Path(cache_dir) / MANIFEST
    if not p.is_file():
        raise RouteUnavailable(f"{cache_dir} has no {MANIFEST} (make one with --export-cache on a connected machine)")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise IntegrityError(f"{p}: not valid JSON (line {e.lineno}, column {e.colno})") from None
    except (UnicodeDecodeError, RecursionError):
        raise IntegrityError(f"{p}: not a UTF-8 JSON index of a plausible depth") from None
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("components"), dict):
        raise IntegrityError(f"{p}: expected {{'schema': 1, 'components': {{...}}}}")
    return data


def _field(p: Path, name: str, entry: dict, key: str, check: Callable[[str], str] | None = None) -> str:
    value = entry.get(key)
    if not isinstance(value, str):
        raise IntegrityError(f"{p}: components.{name}.{key}: expected a string, got {type(value).__name__}")
    if check is not None:
        try:
            check(value)
        except ValueError as e:
            raise IntegrityError(f"{p}: components.{name}.{key}: {e}") from None
    return value


def _artifact_path(cache_dir: Path, p: Path, name: str, file: str) -> Path:
    """The listed artifact, a regular file inside the cache folder (never a link out of it or a device)."""
    path = Path(cache_dir) / file
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise IntegrityError(f"{p}: components.{name}.file: {file!r} is not a regular file in {cache_dir}")
    if not path.exists():
        raise RouteUnavailable(f"{path} is listed in {MANIFEST} but missing")
    return path


def entry_for(cache_dir: Path, component: Component) -> tuple[str, Path, dict]:
    """(route the artifact came from, artifact path, entry) for a component, checked against the lock.

    The artifact's sha256 recorded at export is checked here, before anything is unpacked.
    """
    p = Path(cache_dir) / MANIFEST
    entry = read_index(cache_dir)["components"].get(component.name)
    if entry is None:
        raise RouteUnavailable(f"{p} has no entry for {component.name}")
    if not isinstance(entry, dict):
        raise IntegrityError(f"{p}: components.{component.name}: expected an object, got {type(entry).__name__}")
    name = component.name
    route = entry.get("route")
    if route not in ("git", "pypi"):
        raise IntegrityError(f"{p}: components.{name}.route: unknown route {route!r} (expected git or pypi)")
    file = _field(p, name, entry, "file", names.plain_name)
    sha = _field(p, name, entry, "sha256")
    if not HEX64.match(sha):
        raise IntegrityError(f"{p}: components.{name}.sha256: {sha!r} is not a 64-hex sha256")
    if route == "git":
        commit = _field(p, name, entry, "commit")
        if commit != component.commit:
            raise IntegrityError(
                f"{p}: components.{name}.commit: exported from commit {commit}, the lock pins {component.commit}"
            )
        if "subdir" in entry:
            _field(p, name, entry, "subdir", names.relative_path)
    elif component.pypi is None or file != component.pypi.file:
        raise IntegrityError(f"{p}: components.{name}.file: {file!r} is not the artifact the lock names for {name}")
    elif sha != component.pypi.sha256:
        raise IntegrityError(f"{p}: components.{name}.sha256: {sha} differs from the lock's {component.pypi.sha256}")
    path = _artifact_path(cache_dir, p, name, file)
    found = sha256_file(path)
    if found != sha:
        raise IntegrityError(f"{path}: sha256 {found} differs from the {sha} recorded in {MANIFEST}")
    return route, path, entry


def write_index(cache_dir: Path, updates: dict[str, dict]) -> None:
    cache_dir = Path(cache_dir)
    cache_dir.mkdir(parents=True, exist_ok=True)
    p = cache_dir / MANIFEST
    data = read_index(cache_dir) if p.exists() else {"schema": 1, "components": {}}
    data["components"].update(updates)
    write_json_atomically(p, data, sort_keys=True)
