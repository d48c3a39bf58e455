"""Write several parquet files so that either all appear complete or none is touched.

Existing outputs are replaced only when the caller says so (`overwrite`), or when they are this
writer's own unfinished work: a marker naming the targets is written before the renames and removed
after the last one, so a run interrupted between renames is finished by the next run without asking.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_patches.data.errors import OutputExistsError

MARKER = ".parquet-write-in-progress.json"


def _marker(folder: Path) -> Path:
    return folder / MARKER


def _own_unfinished(targets: list[Path]) -> set[Path]:
    """Targets that an interrupted earlier write (recorded by its marker) may have left half-done."""
    found: set[Path] = set()
    for folder in {t.parent for t in targets}:
        try:
            names = json.loads(_marker(folder).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(names, list):
            found |= {folder / n for n in names if isinstance(n, str)}
    return found


def check_outputs_free(targets: list[Path], overwrite: bool) -> None:
    """Raise `OutputExistsError` naming the first finished output that would be replaced."""
    if overwrite:
        return
    ours = _own_unfinished(targets)
    for target in targets:
        if (target.exists() or target.is_symlink()) and target not in ours:
            raise OutputExistsError(f"{target}: already exists; pass --overwrite to replace it (or choose "
                                    f"another --output_dir)")


def write_tables_atomically(tables: dict[Path, pa.Table], overwrite: bool = False) -> None:
    """Write each table to a temp file beside its target, then rename them all into place."""
    targets = list(tables)
    check_outputs_free(targets, overwrite)
    temps: list[tuple[Path, Path]] = []
    try:
        for target, table in tables.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            temps.append((Path(name), target))
            pq.write_table(table, name)
        folders = sorted({t.parent for t in targets})
        for folder in folders:
            mine = [t.name for t in targets if t.parent == folder]
            tmp = folder / (MARKER + ".tmp")
            tmp.write_text(json.dumps(mine), encoding="utf-8")
            os.replace(tmp, _marker(folder))
        for temp, target in temps:
            os.replace(temp, target)
        for folder in folders:
            _marker(folder).unlink(missing_ok=True)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
