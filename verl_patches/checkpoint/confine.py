"""Names read from checkpoint files are data: each is confined to the folder it belongs to.

A manifest or rank record names files relative to its folder; `check_relpath` refuses any name that could
leave it (absolute, ``..``, empty or ``.`` parts, backslashes, NUL, control characters, overlong), and
`confined_path` walks the name on disk refusing symbolic links on the way, so neither a name nor a link
planted inside a checkpoint reaches a file elsewhere (small files themselves are read with
`verl_patches.base.regular_file.read_regular_file` and ``follow_symlinks=False``). Every refusal is one line
naming the file or name at fault.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_RELPATH_CHARS = 1024
MAX_PART_CHARS = 255


class ConfinementError(ValueError):
    """A name or path that leaves its folder, or is not the kind of file expected; one line naming it."""


def _shown(name: str) -> str:
    return repr(name[:80]) + ("..." if len(name) > 80 else "")


def check_relpath(rel: object, where: str) -> str:
    """``rel`` when it is a relative POSIX name inside its folder; ConfinementError naming ``where`` otherwise."""
    if not isinstance(rel, str) or not rel:
        raise ConfinementError(f"{where}: file name must be a non-empty string, got {_shown(str(rel))}")
    if len(rel) > MAX_RELPATH_CHARS:
        raise ConfinementError(f"{where}: file name longer than {MAX_RELPATH_CHARS} characters ({_shown(rel)})")
    if any(ord(c) < 32 or c in "\\\x7f" for c in rel):
        raise ConfinementError(f"{where}: file name {_shown(rel)} holds a control character or backslash")
    if rel.startswith("/"):
        raise ConfinementError(f"{where}: file name {_shown(rel)} is absolute; names are relative to the folder")
    for part in rel.split("/"):
        if part in ("", ".", ".."):
            raise ConfinementError(
                f"{where}: file name {_shown(rel)} leaves or re-enters its folder ('..', '.' or an empty part)"
            )
        if len(part) > MAX_PART_CHARS:
            raise ConfinementError(f"{where}: file name {_shown(rel)} has a part longer than {MAX_PART_CHARS}")
    return rel


def check_name(name: object, where: str) -> str:
    """A single folder entry name (no '/')."""
    rel = check_relpath(name, where)
    if "/" in rel:
        raise ConfinementError(f"{where}: {_shown(rel)} must be a single name, not a path")
    return rel


def is_real_dir(path: Path) -> bool:
    """A directory that is not a symbolic link."""
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def confined_path(folder: Path, rel: str, where: str) -> Path:
    """``folder/rel`` after checking the name and that no part of it on disk is a symbolic link.

    The last part may be missing (the caller reports that); every part before it must be a real folder.
    """
    check_relpath(rel, where)
    path = Path(folder)
    parts = rel.split("/")
    for i, part in enumerate(parts):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return Path(folder) / rel
        except OSError as err:
            raise ConfinementError(f"{path}: cannot be inspected ({err.strerror})") from None
        if stat.S_ISLNK(mode):
            raise ConfinementError(
                f"{path}: is a symbolic link; files of a checkpoint are never followed out of its folder"
            )
        if i < len(parts) - 1 and not stat.S_ISDIR(mode):
            raise ConfinementError(f"{path}: not a folder")
    return path
