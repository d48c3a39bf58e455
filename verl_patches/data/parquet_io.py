"""Write several parquet files so that either all appear complete or none is touched."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def write_tables_atomically(tables: dict[Path, pa.Table]) -> None:
    """Write each table to a temp file beside its target, then rename them all into place."""
    temps: list[tuple[Path, Path]] = []
    try:
        for target, table in tables.items():
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            os.close(fd)
            temps.append((Path(name), target))
            pq.write_table(table, name)
        for temp, target in temps:
            os.replace(temp, target)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
