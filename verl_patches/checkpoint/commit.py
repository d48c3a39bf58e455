"""The filesystem side of a step checkpoint: staging folder, commit by rename, tracker, pruning, resume lookup.

A save writes into ``.staging-global_step_N``; `commit_step` checks every rank's record, writes the step
manifest last and renames the folder to ``global_step_N`` (one ``rename``: the checkpoint is there
complete or not at all), then updates verl's tracker file. Deletions rename a folder to ``.trash-...``
before removing it, so a half-deleted folder never looks like a checkpoint.
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

from verl_patches.checkpoint.manifest import (MANIFEST_FILE, RANKS_DIR, CheckpointIncomplete, RankRecord,
                                              TrainLayout, check_rank_records, manifest_json, parse_manifest)
from verl_patches.checkpoint.plan import (STAGING_PREFIX, TRACKER_FILE, TRASH_PREFIX, ResumePoint, choose_resume,
                                          parse_step_dir, plan_prune, staging_dir_name, step_dir_name)
from verl_patches.weights.atomic_io import write_json_atomically, write_text_atomically


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    """Rename to a trash name first, then delete: an interrupted delete leaves only trash."""
    if not path.exists():
        return
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}.{uuid.uuid4().hex[:8]}")
    os.rename(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def begin_step(root: Path, step: int) -> Path:
    """A fresh, empty staging folder for ``step`` (a leftover of an interrupted save is removed)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    staging = root / staging_dir_name(step)
    _remove_tree(staging)
    staging.mkdir()
    return staging


def read_manifest(step_dir: Path) -> dict[str, Any]:
    path = Path(step_dir) / MANIFEST_FILE
    if not path.is_file():
        raise CheckpointIncomplete(f"{path}: missing (the save of this step did not finish)")
    data = parse_manifest(path.read_text(encoding="utf-8"), str(path))
    expected = parse_step_dir(Path(step_dir).name)
    if expected is not None and data["step"] != expected:
        raise CheckpointIncomplete(f"{path}: says step {data['step']}, the folder is step {expected}")
    return data


def is_complete(step_dir: Path) -> bool:
    """Its manifest is valid and every file it lists has the recorded size."""
    try:
        data = read_manifest(step_dir)
    except CheckpointIncomplete:
        return False
    for rel, size in data["files"].items():
        p = Path(step_dir) / rel
        if not p.is_file() or p.stat().st_size != size:
            return False
    return True


def listing(root: Path) -> dict[str, bool]:
    """Folder name -> complete, for step, staging and trash folders under ``root``."""
    out: dict[str, bool] = {}
    root = Path(root)
    if not root.is_dir():
        return out
    for p in root.iterdir():
        if not p.is_dir():
            continue
        if parse_step_dir(p.name) is not None:
            out[p.name] = is_complete(p)
        elif p.name.startswith(STAGING_PREFIX) or p.name.startswith(TRASH_PREFIX):
            out[p.name] = False
    return out


def _files_under(folder: Path) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}


def read_rank_records(role_dir: Path) -> list[RankRecord]:
    out = []
    for p in sorted((role_dir / RANKS_DIR).glob("rank_*.json")):
        try:
            out.append(RankRecord.from_json(json.loads(p.read_text(encoding="utf-8"))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise CheckpointIncomplete(f"{p}: unreadable rank record ({type(err).__name__}: {err})") from None
    return out


def role_layout(role_dir: Path) -> TrainLayout | None:
    """The layout every rank of a role saved at, after checking its save is complete; None for a role
    whose checkpoint manager keeps no rank records (verl's FSDP manager)."""
    if not (role_dir / RANKS_DIR).is_dir():
        return None
    records = read_rank_records(role_dir)
    names = {n for r in records for n in r.files}
    sizes = {n: ((role_dir / n).stat().st_size if (role_dir / n).is_file() else None) for n in names}
    return check_rank_records(role_dir.name, records, sizes)


def commit_step(root: Path, staging: Path, step: int, extra: Mapping[str, Any] | None = None) -> Path:
    """Check the staged save, write its manifest, rename it into place and update the tracker."""
    root, staging = Path(root), Path(staging)
    roles = {p.name: role_layout(p) for p in sorted(staging.iterdir()) if p.is_dir()}
    files = _files_under(staging)
    files.pop(MANIFEST_FILE, None)
    write_json_atomically(staging / MANIFEST_FILE, manifest_json(step, roles, files, extra))
    _fsync_dir(staging)
    final = root / step_dir_name(step)
    if final.exists():  # the same step saved again (a resumed run re-reaching it): the new save replaces it
        _remove_tree(final)
    os.rename(staging, final)
    _fsync_dir(root)
    write_text_atomically(root / TRACKER_FILE, str(step))
    return final


def prune(root: Path, keep_last: int | None, protect: tuple[str, ...] = ()) -> list[str]:
    """Delete checkpoints beyond the newest ``keep_last`` and leftovers of interrupted saves; returns names."""
    plan = plan_prune(listing(root), keep_last, protect)
    for name in plan.delete:
        _remove_tree(Path(root) / name)
    return list(plan.delete)


def find_resume(root: Path) -> ResumePoint | None:
    root = Path(root)
    tracker = root / TRACKER_FILE
    text = tracker.read_text(encoding="utf-8") if tracker.is_file() else None
    return choose_resume(listing(root), text)
