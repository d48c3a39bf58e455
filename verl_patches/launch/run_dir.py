"""The launch's run folder and the files in it: created new, private, and written relative to its descriptor.

The run folder's name is predictable to the second (profile, time, role, host), and `LOG_DIR` may be shared:
whoever can write into it could have created that name first, put links where the launcher's files go, or
rename the new folder away after it is made and put a link to a folder of theirs in its place. So:

* the root is checked (`check_log_root`): a `LOG_DIR` in which another account could rename or replace our
  folder (writable by group or others without the sticky bit, another user's, or a level above it that is:
  `base.folder_access`) is refused, naming the level; a sticky shared one (``/tmp``) is named in one line;
* the run folder is made by ``mkdir`` relative to the root's descriptor, 0700, and opened at once with
  ``O_DIRECTORY | O_NOFOLLOW`` (a name taken by someone else gets a suffix: never reused); its descriptor is
  kept (`RunDir`) and every file the launcher writes there is created through it (``openat`` with
  ``O_EXCL | O_NOFOLLOW``; `pids.json` by `base.atomic_write.write_text_at`), so renaming the folder or the
  root meanwhile cannot redirect a write;
* what other processes write there by path (the trainer's TensorBoard events and activation records, Ray's
  log) is safe for the same reasons: the folder is 0700 and ours, so no one else can create or replace an
  entry in it, and no one else can rename it or a level above it (the root check), so the path still leads to
  it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from verl_patches.base.atomic_write import write_text_at
from verl_patches.base.folder_access import access_problem

RUN_DIR_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC


class LogDirError(OSError):
    """A log folder the launcher will not write into; one line naming it."""


def make_log_root(root: Path) -> None:
    """``root`` and its missing levels, created 0755 (``mkdir -p`` would follow the umask: a 002 umask would
    make a root `check_log_root` refuses)."""
    missing = []
    level = Path(root)
    while not os.path.lexists(level) and level != level.parent:
        missing.append(level)
        level = level.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o755)
        except FileExistsError:
            pass


def check_log_root(root: Path) -> str:
    """'' for a log root only its owner (or root) can change; a warning line for a shared folder with the sticky
    bit (such as /tmp: others cannot remove or replace what the launcher creates there). A folder in which
    another account could rename or replace the run folder (see the module) is refused, naming the level."""
    st = os.stat(root)
    if st.st_mode & 0o002 and not st.st_mode & 0o1000:
        raise LogDirError(
            f"LOG_DIR {root}: writable by every user and not sticky (mode {st.st_mode & 0o7777:o}); "
            "choose a folder only you can write into"
        )
    if st.st_uid not in (os.getuid(), 0):
        raise LogDirError(f"LOG_DIR {root}: owned by another user (uid {st.st_uid}); choose a folder of yours")
    problem = access_problem(root, private=False)
    if problem:
        raise LogDirError(
            f"LOG_DIR {root}: others could replace the run folder there ({problem}); choose a folder only you "
            "can write into"
        )
    if st.st_mode & 0o022:
        return (
            f"LOG_DIR {root} is writable by others (mode {st.st_mode & 0o7777:o}, sticky); this launch writes only "
            "into its own new private run folder there"
        )
    return ""


def _new_file(dir_fd: int, name: str, mode: str, shown: Path) -> IO[Any]:
    if not name or "/" in name or name in (".", ".."):
        raise ValueError(f"{shown}: {name!r} is not one file name")
    fd = os.open(name, _NEW_FILE, 0o600, dir_fd=dir_fd)
    return os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


@dataclass
class RunDir:
    """The run folder this launch created, held open: files are created relative to ``fd``."""

    path: Path
    fd: int

    def open_new(self, name: str, mode: str = "ab") -> IO[Any]:
        """A file of the run folder, created by this call through the folder's descriptor, never through a link
        (O_EXCL | O_NOFOLLOW), private to this account (0600)."""
        return _new_file(self.fd, name, mode, self.path)

    def write_text(self, name: str, text: str) -> None:
        """``name`` in the run folder replaced whole by ``text``, through the folder's descriptor."""
        write_text_at(self.fd, name, text, mode=0o600, folder=self.path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _opened_run_dir(root_fd: int, name: str, path: Path) -> int:
    """The descriptor of the folder just made as ``name``; refused when it is no longer ours (replaced before
    it could be opened: only an account that can write into the root could, which `check_log_root` refuses)."""
    try:
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=root_fd)
    except OSError as err:
        raise LogDirError(
            f"{path}: replaced while being created ({err.strerror}); refusing to write logs there"
        ) from None
    st = os.fstat(fd)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise LogDirError(f"{path}: replaced while being created; refusing to write logs there")
    return fd


def new_run_dir(root: Path, name: str) -> RunDir:
    """A run folder created by this call, relative to the root's descriptor (never one that was there: a
    predictable name taken by someone else gets a suffix), 0700, a real folder of this user, held open."""
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for n in range(1000):
            candidate = name if n == 0 else f"{name}-{n}"
            try:
                os.mkdir(candidate, RUN_DIR_MODE, dir_fd=root_fd)
            except FileExistsError:
                continue
            return RunDir(root / candidate, _opened_run_dir(root_fd, candidate, root / candidate))
    finally:
        os.close(root_fd)
    raise LogDirError(f"{root}: no free run folder name for {name}")


def open_new(path: Path, mode: str = "ab") -> IO[Any]:
    """A file created by this call at ``path``, never through a link (O_EXCL | O_NOFOLLOW), relative to a
    descriptor of its folder; for writers outside the launcher itself (the Ray node's log) that are handed a
    path in the run folder."""
    path = Path(path)
    dir_fd = os.open(path.parent, _DIR_FLAGS)
    try:
        return _new_file(dir_fd, path.name, mode, path.parent)
    finally:
        os.close(dir_fd)
