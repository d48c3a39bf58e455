"""Resuming a conversion: the output directory's manifest, checked against what this run would write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from verl_patches.weights.errors import ResumeError




def read_manifest(out_dir: Path, manifest_file: str) -> dict[str, Any] | None:
    path = Path(out_dir) / manifest_file
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ResumeError(f"{path}: line {err.lineno}: corrupt manifest ({err.msg}); pass --overwrite") from None
    except (RecursionError, UnicodeDecodeError):
        raise ResumeError(f"{path}: corrupt manifest (not UTF-8 JSON of a plausible depth); pass --overwrite") from None


def resume_manifest(out_dir: Path, key: Mapping[str, Any], overwrite: bool, items: str,
                    manifest_file: str) -> dict[str, Any]:
    """The manifest to resume from, or a fresh one (`key` plus an empty `items` table).

    Refuses a directory that holds a different conversion, or files and no manifest (someone else's).
    """
    out_dir = Path(out_dir)
    fresh = dict(key, **{items: {}}, complete=False)
    if overwrite or not out_dir.exists():
        return fresh
    man = read_manifest(out_dir, manifest_file)
    if man is not None:
        diff = [k for k in key if man.get(k) != key[k]]
        if diff:
            raise ResumeError(f"{out_dir / manifest_file}: the output directory holds a conversion with a different "
                              f"{diff[0]!r} ({man.get(diff[0])!r} != {key[diff[0]]!r}); choose another directory or "
                              f"pass --overwrite")
        man.setdefault(items, {})
        return man
    foreign = sorted(p.name for p in out_dir.iterdir() if not p.name.startswith("."))
    if foreign:
        raise ResumeError(f"{out_dir}: output directory is not empty and has no {manifest_file} (found "
                          f"{foreign[0]!r}); choose another directory or pass --overwrite")
    return fresh
