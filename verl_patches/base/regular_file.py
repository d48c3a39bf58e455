"""Read a small input file that a user names, refusing anything that is not a regular file.

`Path.read_text` on a FIFO blocks until a writer appears (forever, for a tool run by hand), on a folder it
raises `IsADirectoryError`, and on `/dev/zero` it never ends. Here the path is checked with `stat` before it
is opened, opened non-blocking (a FIFO swapped in between cannot block the open) and checked again on the
open descriptor, and at most ``max_bytes`` are read. Errors are one line naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import BinaryIO

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISLNK, "a symbolic link"),
)


class FileRefused(ValueError):
    """The path is missing, not a regular file, too large or unreadable; the message is one line."""


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


class FileMissing(FileRefused):
    """The path does not exist."""


def open_regular_file(path: str | os.PathLike[str], *, follow_symlinks: bool = True) -> BinaryIO:
    """``path`` opened for binary reading (blocking), after checking it is a regular file before and after the
    open (`FileRefused`, or `FileMissing` when it does not exist). The caller closes it.

    With ``follow_symlinks=False`` a symbolic link is refused without reading what it points at.
    """
    p = Path(path)
    try:
        st = os.stat(p, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise FileMissing(f"{p}: no such file") from None
    except OSError as e:
        raise FileRefused(f"{p}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise FileRefused(f"{p}: not a regular file ({_kind(st.st_mode)})")
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(p, flags)
    except OSError as e:
        raise FileRefused(f"{p}: cannot open ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the stat and the open
            raise FileRefused(f"{p}: not a regular file ({_kind(st.st_mode)})")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular_file(path: str | os.PathLike[str], *, max_bytes: int, follow_symlinks: bool = True) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (`FileRefused` otherwise).

    With ``follow_symlinks=False`` a symbolic link is refused without reading what it points at.
    """
    p = Path(path)
    with open_regular_file(p, follow_symlinks=follow_symlinks) as f:
        try:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise FileRefused(f"{p}: {size} bytes, more than the {max_bytes} this file may have")
            data = f.read(max_bytes + 1)
        except OSError as e:
            raise FileRefused(f"{p}: cannot read ({e.strerror or e})") from None
    if len(data) > max_bytes:  # grew while being read
        raise FileRefused(f"{p}: more than the {max_bytes} bytes this file may have")
    return data
