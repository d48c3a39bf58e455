"""One file per process that activated the overlay, when the launcher asks for it.

The console line "verl_patches active in pid N" is evidence only while every process's log reaches the
console unchanged; Ray folds identical worker lines ("[repeated Nx across cluster]"). A record per process,
written where the launcher points `VERL_PATCHES_ACTIVATION_DIR` (the run's log folder), does not depend
on log handling. Each record also carries the CPU-numerics variables the process ran under
(`base/cpu_numerics.py`): the tiny run's floats depend on them in every process, Ray workers included.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

from verl_patches.base import cpu_numerics, env_registry
from verl_patches.base.atomic_write import is_temp_name, write_json_atomically

ACTIVATION_DIR_ENV = "VERL_PATCHES_ACTIVATION_DIR"


def write_record(summary: str, patches: dict[str, str]) -> Path | None:
    """Write <dir>/<host>-<pid>.json (atomically); None when no folder is asked for or it cannot be written."""
    folder = env_registry.text(ACTIVATION_DIR_ENV)
    if not folder:
        return None
    host, pid = socket.gethostname(), os.getpid()
    record = {
        "host": host,
        "pid": pid,
        "argv0": sys.argv[0] if sys.argv else "",
        "summary": summary,
        "patches": patches,
        "cpu_numerics": cpu_numerics.current(),
    }
    try:
        # the host name is data: keep only characters that cannot leave the folder
        safe_host = "".join(c if c.isalnum() or c in "-_." else "_" for c in host).lstrip(".") or "host"
        target = Path(folder) / f"{safe_host}-{pid}.json"
        write_json_atomically(target, record, indent=None)
        return target
    except OSError as e:  # evidence only: never stop a process for it, but say so
        print(f"verl_patches: could not write the activation record in {folder}: {e}", file=sys.stderr)
        return None


def read_records(folder: Path) -> list[dict[str, Any]]:
    """Every record in the folder (for the tests and whoever checks a run); a record still being written
    (its temp file) is not one yet."""
    paths = sorted(p for p in Path(folder).glob("*.json") if not is_temp_name(p.name))
    return [json.loads(p.read_text(encoding="utf-8")) for p in paths]
