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
to be root or us. The two rules, on one folder's status (`passage_problem` for a level we go through,
`private_problem` for the folder we trust), are also what `base.private_dir` applies level by level to the
descriptors it walks with: one home for who may change a folder.
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


def passage_problem(st: os.stat_result, uid: int, name: str | None = None) -> str | None:
    """Why another account can rename or replace ``name`` in a folder we go through (``st``: that folder's
    status; ``name`` None: whatever each user creates in it), or None: the folder must be root's or this
    account's, and writable by group/others only when sticky. No path in the line: the caller names the
    folder. The one rule for the levels above a folder we trust, whether read by path (`access_problem`) or
    by descriptor (`base.private_dir`)."""
    if name is None:
        owned, writable = "who can replace what is in it", "they can replace what is in it"
    else:
        owned, writable = f"who can rename {name!r} in it", f"they can rename {name!r} and put their own in its place"
    if st.st_uid not in (0, uid):
        return f"owned by uid {st.st_uid} (neither root nor this account), {owned}"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"writable by group/others and not sticky ({_mode(st)}): {writable}"
    return None


def private_problem(st: os.stat_result, uid: int) -> str | None:
    """Why what lies in a folder (or a file) with status ``st`` cannot be trusted as this account's alone:
    another owner, or writable by group/others, sticky or not; None when it can. No path in the line, and
    the kind of entry is the caller's to check."""
    if st.st_uid != uid:
        return f"owned by uid {st.st_uid}, not by this account (uid {uid})"
    if st.st_mode & 0o022:
        sticky = ", sticky" if st.st_mode & stat.S_ISVTX else ""
        return f"writable by group/others ({_mode(st)}{sticky})"
    return None


def _level_problem(folder: Path, name: str, uid: int) -> str | None:
    st = os.stat(folder)
    if problem := passage_problem(st, uid, name):
        return f"{folder}: {problem}"
    if st.st_mode & 0o022:  # sticky: the entry's owner can still rename it
        entry = os.lstat(folder / name)
        if entry.st_uid not in (0, uid):
            return f"{folder / name}: owned by uid {entry.st_uid} in the shared folder {folder}, who can replace it"
    return None


def access_problem(path: str | os.PathLike[str], *, private: bool, uid: int | None = None) -> str | None:
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
    problem = private_problem(final, uid) if private else passage_problem(final, uid)
    return f"{real}: {problem}" if problem else None


__all__ = ["MAX_LINKS", "access_problem", "passage_problem", "private_problem"]
