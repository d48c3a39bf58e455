"""Who besides this account can change what lies at a folder's path: the folder itself and every level above it.

A folder we write into and later trust (the checkpoint root, the launch's log folder) is only as safe as the
folders its path goes through: whoever can write into one of them can rename the next level away and put a
folder (or a link) of their own in its place, and whoever can write into the folder itself can replace what
we put there. `access_problem` reads each level with ``lstat`` and says, in one line naming the level, why
another account could:

* every folder the path goes through (links in the spelling included: the folder holding a link can
  retarget it) must be owned by root or by this account, and writable by group/others only when sticky
  (``/tmp``), and then the entry we go through must itself be root's or ours (the sticky bit lets its
  owner rename it);
* the folder itself (``private=True``, e.g. a checkpoint root) must be this account's and not writable by
  group or others, sticky or not: what lies in it is trusted as ours. With ``private=False`` (a log root in
  which each launch creates a private folder of its own) it is judged as the levels above it.

Group bits show a POSIX ACL's mask, so a folder an ACL lets another user write into is named too. This is a
check of permissions, read by path: an account that can change them is the owner, which the check requires
to be root or us.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_LINKS = 40  # as the kernel's limit on links followed while resolving one path


def _mode(st: os.stat_result) -> str:
    return f"mode {stat.S_IMODE(st.st_mode):o}"


def _lookups(path: Path) -> tuple[list[tuple[Path, str]], Path]:
    """(the (real folder, name) pairs resolving ``path`` looks up, in order; the real folder it ends at).

    Links are followed as the kernel follows them, so the folder holding each link is a level too."""
    pending = list(Path(os.path.abspath(path)).parts[1:])
    here, seen, links = Path("/"), [], 0
    while pending:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            here = here.parent
            continue
        seen.append((here, name))
        nxt = here / name
        if os.path.islink(nxt):
            links += 1
            if links > MAX_LINKS:
                raise OSError(f"{path}: more than {MAX_LINKS} symbolic links on the way")
            target = Path(os.readlink(nxt))
            if target.is_absolute():
                here = Path("/")
            pending = [p for p in target.parts if p != "/"] + pending
        else:
            here = nxt
    return seen, here


def _level_problem(folder: Path, name: str, uid: int) -> str | None:
    st = os.stat(folder)
    if st.st_uid not in (0, uid):
        return f"{folder}: owned by uid {st.st_uid} (neither root nor this account), who can rename {name!r} in it"
    if st.st_mode & 0o022:
        if not st.st_mode & stat.S_ISVTX:
            return (
                f"{folder}: writable by group/others and not sticky ({_mode(st)}): they can rename {name!r} "
                "and put their own in its place"
            )
        entry = os.lstat(folder / name)
        if entry.st_uid not in (0, uid):
            return f"{folder / name}: owned by uid {entry.st_uid} in the shared folder {folder}, who can replace it"
    return None


def _container_problem(folder: Path, uid: int) -> str | None:
    """A folder judged as a level above what each user creates in it (``private=False``)."""
    st = os.stat(folder)
    if st.st_uid not in (0, uid):
        return f"{folder}: owned by uid {st.st_uid} (neither root nor this account), who can replace what is in it"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{folder}: writable by group/others and not sticky ({_mode(st)}): they can replace what is in it"
    return None


def _private_problem(folder: Path, st: os.stat_result, uid: int) -> str | None:
    if st.st_uid != uid:
        return f"{folder}: owned by uid {st.st_uid}, not by this account (uid {uid})"
    if st.st_mode & 0o022:
        sticky = ", sticky" if st.st_mode & stat.S_ISVTX else ""
        return f"{folder}: writable by group/others ({_mode(st)}{sticky})"
    return None


def access_problem(path: str | os.PathLike, *, private: bool, uid: int | None = None) -> str | None:
    """None when only this account (and root) can change what lies at ``path`` (an existing folder), else
    one line naming the level at fault and why; ``private``: the folder itself must be ours and writable by
    no one else (see the module). OSError when a level cannot be read (the caller names the folder)."""
    uid = os.geteuid() if uid is None else uid
    seen, real = _lookups(Path(path))
    final = os.stat(real)
    if not stat.S_ISDIR(final.st_mode):
        return f"{real}: not a folder"
    for folder, name in seen:
        problem = _level_problem(folder, name, uid)
        if problem:
            return problem
    return _private_problem(real, final, uid) if private else _container_problem(real, uid)


__all__ = ["MAX_LINKS", "access_problem"]
