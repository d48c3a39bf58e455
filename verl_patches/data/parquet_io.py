"""Write several parquet files so that either all appear complete or none is touched.

Existing outputs are replaced only when the caller says so (`overwrite`), or when they are this
writer's own unfinished work: a marker naming the targets is written before the renames and removed
after the last one, so a run interrupted between renames is finished by the next run without asking.

Temporary files are named ``.<target>.<host>.<pid>.<random>.tmp`` so the next run can tell a killed run's
leftovers (this host, a process that no longer exists) from anything else, and removes only those. They are
created with mode 0666 minus the umask, as any file the user writes, so the outputs are as readable as the
user's umask says (Ray workers under another account on shared storage read them).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from verl_patches.data.errors import OutputExistsError

MARKER = ".parquet-write-in-progress.json"
_TEMP = re.compile(r"\.(?P<target>[^/]+\.parquet)\.(?P<host>[A-Za-z0-9-]{1,32})\.(?P<pid>\d{1,10})\.[0-9a-f]{8}\.tmp")


def _marker(folder: Path) -> Path:
    return folder / MARKER


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (alive), or not a pid we can ask about: leave its file
    return True


def _is_stale_temp(name: str) -> bool:
    m = _TEMP.fullmatch(name)
    if m:
        return m["host"] == _host() and int(m["pid"]) != os.getpid() and not _pid_alive(int(m["pid"]))
    return name == MARKER + ".tmp"


def remove_stale_temps(folder: Path) -> list[str]:
    """Remove the temporary files a killed earlier run of this writer left in ``folder``; nothing else."""
    removed = []
    if not folder.is_dir():
        return removed
    for p in folder.iterdir():
        if _is_stale_temp(p.name) and p.is_file() and not p.is_symlink():
            p.unlink(missing_ok=True)
            removed.append(p.name)
    return sorted(removed)


def _new_temp(target: Path) -> Path:
    """A fresh temp file beside ``target``, created exclusively with 0666 minus the umask."""
    while True:
        path = target.parent / f".{target.name}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
            return path
        except FileExistsError:
            continue


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
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = _new_temp(target)
            temps.append((temp, target))
            pq.write_table(table, str(temp))
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
