"""The launch's run folder and the files in it: created new, never through a link.

The run folder's name is predictable to the second (profile, time, role, host), and `LOG_DIR` may be shared:
whoever can write into it could have created that name first, or put links where the launcher's files go.
So the root is checked (`check_log_root`), the run folder is created by the launcher itself (a name that
exists gets a suffix: never reused) and every file in it is created with O_EXCL | O_NOFOLLOW (`open_new`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import IO, Any


class LogDirError(OSError):
    """A log folder the launcher will not write into; one line naming it."""


def check_log_root(root: Path) -> str:
    """'' for a log root only its owner (or root) can write into; a warning line for a shared folder with
    the sticky bit (such as /tmp: others cannot remove or replace what the launcher creates there). A
    folder others can write into without the sticky bit is refused: they could swap the run folder."""
    st = os.stat(root)
    if st.st_mode & 0o002 and not st.st_mode & 0o1000:
        raise LogDirError(
            f"LOG_DIR {root}: writable by every user and not sticky (mode {st.st_mode & 0o7777:o}); "
            "choose a folder only you can write into"
        )
    if st.st_uid not in (os.getuid(), 0):
        raise LogDirError(f"LOG_DIR {root}: owned by another user (uid {st.st_uid}); choose a folder of yours")
    if st.st_mode & 0o022:
        return (
            f"LOG_DIR {root} is writable by others (mode {st.st_mode & 0o7777:o}); this launch writes only "
            "into its own new run folder there"
        )
    return ""


def new_run_dir(root: Path, name: str) -> Path:
    """A run folder created by this call (never one that was there: a predictable name taken by someone else
    gets a suffix), a real folder of this user."""
    for n in range(1000):
        path = root / (name if n == 0 else f"{name}-{n}")
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            continue
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            raise LogDirError(f"{path}: replaced while being created; refusing to write logs there")
        return path
    raise LogDirError(f"{root}: no free run folder name for {name}")


def open_new(path: Path, mode: str = "ab") -> IO[Any]:
    """A file of the run folder, created by this call and never through a link (O_EXCL | O_NOFOLLOW)."""
    flags = (
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    return os.fdopen(os.open(path, flags, 0o644), mode, **({} if "b" in mode else {"encoding": "utf-8"}))
