"""Write-then-rename file helpers, checksums and small-file copying.

Every output file is first written under a temporary name in its target directory and then moved into
place with ``os.replace``, so an interrupted run never leaves a half-written file under a final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable

TMP_PREFIX = ".verl_patches-tmp-"  # + 16 hex digits + "." + the target's name: no user file is named so
_TMP_NAME = re.compile(r"\.verl_patches-tmp-[0-9a-f]{16}\..+", re.DOTALL)


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temp files (`temp_path_for`): the only names a tool removes unasked."""
    return bool(_TMP_NAME.fullmatch(name))


_HASH_CHUNK = 8 << 20


def temp_path_for(target: Path) -> Path:
    """A fresh temporary file beside ``target`` (same filesystem, so the rename is atomic), created with mode
    0666 minus the umask like any file the user writes (mkstemp's 0600 would make every output unreadable to
    the other accounts of a shared storage, whatever the umask says)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = target.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}.{target.name[:200]}"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
            return path
        except FileExistsError:
            continue


def write_atomically(target: Path, writer: Callable[[Path], None]) -> None:
    """Call ``writer(tmp_path)`` and rename the result onto ``target``; the temp file goes on failure."""
    target = Path(target)
    tmp = temp_path_for(target)
    try:
        writer(tmp)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomically(target: Path, text: str) -> None:
    write_atomically(Path(target), lambda p: p.write_text(text, encoding="utf-8"))


def write_json_atomically(target: Path, data: Any) -> None:
    write_text_atomically(Path(target), json.dumps(data, indent=2, sort_keys=False) + "\n")


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def copy_file_atomically(src: Path, dst: Path) -> None:
    write_atomically(Path(dst), lambda p: shutil.copyfile(src, p))


def remove_stale_temps(directory: Path) -> int:
    """Delete temp files left by an interrupted run in ``directory`` (not recursive); returns the count."""
    n = 0
    if Path(directory).is_dir():
        for p in Path(directory).iterdir():
            if is_temp_name(p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                n += 1
    return n
