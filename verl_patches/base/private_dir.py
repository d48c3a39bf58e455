"""A cache folder only this account can change, opened one name at a time so that what is checked is what is used.

A cache we load code from (a compiled extension, wheels) is only as trustworthy as the folders that hold it:
whoever can write into one of them, or rename it, can plant a file there. `open_private_dir` therefore walks
from ``/`` to the folder with descriptors (``openat``, never following a link at any depth) and checks each
level as it goes, with the rules of `base.folder_access` (`private_problem`, `passage_problem`) applied to the
descriptor it holds:

* the cache root and every level below it (created 0700 where missing) must be owned by this account and not
  writable by group or others;
* the folders above the root must be owned by root or by this account, and writable by group/others only when
  sticky (``/tmp``: the others cannot rename or remove what is ours there).

Links in the root's own spelling (``~/.cache`` linked to a scratch disk) are resolved once, up front; from
there on every name is opened with ``O_NOFOLLOW``, so a folder swapped for a link after the check is refused,
not followed. The descriptor returned is the checked folder itself: files are opened relative to it.

Refusals are one line, `PrivateDirError`, naming the folder and the fix.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path

from verl_patches.base.folder_access import passage_problem, private_problem

_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_PATH: an ancestor we may not list (/home at 0711) can still be opened to walk through and fstat
_ANCESTOR_FLAGS = _DIR_FLAGS | getattr(os, "O_PATH", os.O_RDONLY)


class PrivateDirError(PermissionError):
    """A cache folder others can change (or one we cannot check); the message names it and the fix."""


def _not_ours(st: os.stat_result, uid: int, *, right_kind: bool, kind: str) -> str | None:
    if not right_kind:
        return f"is not a {kind}"
    why = private_problem(st, uid)
    return f"is {why}" if why else None


def _why_not_ours(st: os.stat_result, uid: int) -> str | None:
    return _not_ours(st, uid, right_kind=stat.S_ISDIR(st.st_mode), kind="folder")


def file_not_ours(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a file of a private cache cannot be trusted (not a regular file, another owner, writable by
    group/others), or None when it can."""
    uid = os.geteuid() if uid is None else uid
    return _not_ours(st, uid, right_kind=stat.S_ISREG(st.st_mode), kind="regular file")


def _fix(path: Path, why: str, root_hint: str) -> str:
    if "writable by group/others" in why:
        return f"`chmod go-w {path}`, or {root_hint}"
    return root_hint


def open_private_dir(root: str | os.PathLike[str], below: Sequence[str] = (), *, root_hint: str) -> tuple[int, Path]:
    """A descriptor of ``root/below[0]/below[1]/...`` and that folder's path, every level checked as the module
    says; missing levels from the root down are created 0700. ``below`` are single names (no ``/``, ``..``).
    ``root_hint`` is the way out the message offers (e.g. "set XDG_CACHE_HOME to a folder only you can write").
    The caller closes the descriptor (`private_dir` does)."""
    for name in below:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"open_private_dir: {name!r} is not one folder name")
    uid = os.geteuid()
    root_hint = root_hint.removeprefix("or ")  # the messages put their own "or" before it
    real_root = Path(os.path.realpath(os.path.abspath(os.fspath(root))))
    parts = real_root.parts[1:]
    levels = [(name, False) for name in parts[:-1]] + [(name, True) for name in (*parts[-1:], *below)]
    path = Path("/")
    fd = os.open("/", _ANCESTOR_FLAGS)
    try:
        if levels and (why := passage_problem(os.fstat(fd), uid, levels[0][0])):
            raise PrivateDirError(f"{path}: is {why}; {root_hint}")
        for i, (name, private) in enumerate(levels):
            path = path / name
            if private:
                try:
                    os.mkdir(name, 0o700, dir_fd=fd)
                except FileExistsError:
                    pass
                except OSError as err:
                    raise PrivateDirError(f"{path}: cannot be created ({err.strerror}); {root_hint}") from None
            try:
                child = os.open(name, _DIR_FLAGS if private else _ANCESTOR_FLAGS, dir_fd=fd)
            except OSError as err:
                if os.path.islink(path):
                    raise PrivateDirError(
                        f"{path}: is a symbolic link; a cache folder is never followed through links: remove it, "
                        f"or {root_hint}"
                    ) from None
                raise PrivateDirError(f"{path}: cannot be opened ({err.strerror}); {root_hint}") from None
            os.close(fd)
            fd = child
            st = os.fstat(fd)
            if private:
                why = _why_not_ours(st, uid)
            else:  # an ancestor is always followed by the level it leads to
                why = passage_problem(st, uid, levels[i + 1][0])
                why = f"is {why}" if why else None
            if why:
                raise PrivateDirError(f"{path}: {why}; {_fix(path, why, root_hint)}")
        return fd, path
    except BaseException:
        os.close(fd)
        raise


@contextlib.contextmanager
def private_dir(
    root: str | os.PathLike[str], below: Sequence[str] = (), *, root_hint: str
) -> Iterator[tuple[int, Path]]:
    """`open_private_dir` as a context: the descriptor is closed when the block ends."""
    fd, path = open_private_dir(root, below, root_hint=root_hint)
    try:
        yield fd, path
    finally:
        os.close(fd)
