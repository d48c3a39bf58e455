"""An output folder of a conversion: resume from our own manifest there, start fresh in an empty or new folder,
and with ``--overwrite`` remove only what our own earlier manifest lists.

Whose files are these? Only a manifest of this very tool (its ``tool`` key) tells. A folder that holds
anything else and no such manifest (another model, someone's data, an actor checkpoint) is refused with or
without ``--overwrite``: nothing there is ours to replace or delete. Our own temporary files (``.verl_patches-tmp-*``,
left by a killed run) do not make a folder foreign.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import is_temp_name
from verl_patches.weights.errors import ManifestError, ResumeError
from verl_patches.weights.manifest_file import parse_file_entries, parse_file_list, read_manifest_json

FILES_KEY = "files"  # the other files a run wrote beside its items (index, config, tokenizer files)


def read_manifest(out_dir: Path, manifest_file: str) -> dict[str, Any] | None:
    """The manifest JSON object in ``out_dir`` (strict reading, `manifest_file.read_manifest_json`), or None."""
    return read_manifest_json(Path(out_dir) / manifest_file)


@dataclass
class OutputPlan:
    """What a run does with its output folder."""

    manifest: dict[str, Any]  # the manifest this run continues: ours resumed, or a fresh one
    previous: dict[str, Any] | None = None  # with --overwrite: our earlier manifest, whose files may go


def _foreign_entries(out_dir: Path) -> list[str]:
    return sorted(
        p.name for p in out_dir.iterdir() if not (is_temp_name(p.name) and p.is_file() and not p.is_symlink())
    )


def plan_output(
    out_dir: Path,
    key: Mapping[str, Any],
    overwrite: bool,
    items: str,
    manifest_file: str,
    name_ok: Callable[[object], bool],
    what: str,
) -> OutputPlan:
    """Resume, start fresh, or (``overwrite``) start fresh over our own earlier run; refuse anything else.

    ``key`` identifies the conversion (tool, source, layout, ...); ``items`` is the manifest's table of
    finished outputs, whose names ``name_ok`` must accept (a ``what`` name).
    """
    out_dir = Path(out_dir)
    fresh: dict[str, Any] = dict(key, **{items: {}}, complete=False)
    if not out_dir.exists() and not out_dir.is_symlink():
        return OutputPlan(fresh)
    if not out_dir.is_dir():
        raise ResumeError(f"{out_dir}: the output path exists and is not a directory")
    path = out_dir / manifest_file
    try:
        man = read_manifest(out_dir, manifest_file)
        if man is not None and man.get("tool") != key["tool"]:
            raise ManifestError(f"{path}: key 'tool': written by {str(man.get('tool'))[:60]!r}, not by {key['tool']}")
        if man is not None:
            man[items] = parse_file_entries(man, items, path, name_ok, what)
            man[FILES_KEY] = parse_file_list(man, FILES_KEY, path)
    except ManifestError as e:
        raise ResumeError(
            f"{e}; cannot tell which files of {out_dir} this tool wrote: move them aside or choose "
            f"another output directory"
        ) from None
    if man is None:
        foreign = _foreign_entries(out_dir)
        if foreign:
            raise ResumeError(
                f"{out_dir}: the output directory holds files this tool did not write (found "
                f"{foreign[0]!r}) and no {manifest_file}; choose an empty or new output directory"
            )
        return OutputPlan(fresh)
    if overwrite:
        return OutputPlan(fresh, previous=man)
    diff = [k for k in key if man.get(k) != key[k]]
    if diff:
        raise ResumeError(
            f"{path}: the output directory holds a conversion with a different {diff[0]!r} "
            f"({str(man.get(diff[0]))[:80]} != {str(key[diff[0]])[:80]}); choose another directory "
            f"or pass --overwrite to replace the files this manifest lists"
        )
    return OutputPlan(man)


def remove_listed(
    out_dir: Path,
    previous: Mapping[str, Any] | None,
    items: str,
    keep: set[str],
    item_path: Callable[[str], str] = lambda name: name,
    keep_files: set[str] = frozenset(),
) -> list[str]:
    """Delete what ``previous`` (our earlier manifest, names already checked) lists and this run will not
    write again: its ``items`` not in ``keep`` (at ``item_path(name)``), its other files not in ``keep_files``.
    Returns the relative paths removed; a listed file that is gone already is skipped."""
    if previous is None:
        return []
    out_dir = Path(out_dir)
    removed = []
    targets = [item_path(n) for n in previous.get(items, {}) if n not in keep]
    targets += [n for n in previous.get(FILES_KEY, []) if n not in keep_files]
    for rel in targets:
        p = out_dir / rel
        if not _inside_without_links(out_dir, rel) or not p.is_file():
            continue
        p.unlink()
        removed.append(rel)
        parent = p.parent
        if parent != out_dir and not any(parent.iterdir()):  # a rank folder left empty
            parent.rmdir()
    return removed


def _inside_without_links(out_dir: Path, rel: str) -> bool:
    """No component of ``rel`` below ``out_dir`` is a symlink: a planted ``mp_rank_00 -> /elsewhere`` must not
    turn a listed name into a deletion outside the folder."""
    p = Path(out_dir)
    for part in Path(rel).parts:
        if part in ("..", "/") or "/" in part:
            return False
        p = p / part
        if p.is_symlink():
            return False
    return True
