"""Write several parquet files so that either all appear complete or none is touched.

Existing outputs are replaced only when the caller says so (`overwrite`), or when they are this
writer's own unfinished work: a marker naming the targets is written before the renames and removed
after the last one, so a run interrupted between renames is finished by the next run without asking.

Temporary files are this repository's owned temps (`verl_patches.base.atomic_write`, ``owned=True``): their
names hold the writer's pid and host, so the next run can tell a killed run's leftovers (this host, a process
that no longer exists) from anything else, and removes only those (`remove_abandoned_temps`). They are created
with mode 0666 minus the umask, as any file the user writes, so the outputs are as readable as the user's umask
says (Ray workers under another account on shared storage read them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_patches.base.atomic_write import commit, discard, temp_path_for
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
            raise OutputExistsError(
                f"{target}: already exists; pass --overwrite to replace it (or choose another --output_dir)"
            )


def write_tables_atomically(tables: dict[Path, pa.Table], overwrite: bool = False) -> None:
    """Write each table to a temp file beside its target, then rename them all into place."""
    targets = list(tables)
    check_outputs_free(targets, overwrite)
    temps: list[tuple[Path, Path]] = []
    try:
        for target, table in tables.items():
            temp = temp_path_for(target, owned=True)
            temps.append((temp, target))
            pq.write_table(table, str(temp))
        folders = sorted({t.parent for t in targets})
        for folder in folders:
            mine = [t.name for t in targets if t.parent == folder]
            marker_temp = temp_path_for(_marker(folder), owned=True)
            try:
                marker_temp.write_text(json.dumps(mine), encoding="utf-8")
                commit(marker_temp, _marker(folder))
            finally:
                discard(marker_temp)
        for temp, target in temps:
            commit(temp, target)
        for folder in folders:
            _marker(folder).unlink(missing_ok=True)
    finally:
        for temp, _ in temps:
            discard(temp)
