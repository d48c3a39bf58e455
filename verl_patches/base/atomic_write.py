"""Files and folders put in place whole: written under a temporary name beside the target, then renamed.

A reader (or a run resumed after a kill) sees the old content or the new, never half a file: the new file is
written under a temp name in the target's folder (same filesystem, so the rename is atomic), flushed to disk
(``fsync``), renamed over the target, and the folder is flushed so the rename itself survives a crash.

Temp files are created exclusively (two writers of one target never share a temp file) with mode 0666 minus
the umask, as any file the user writes: ``mkstemp``'s 0600 would make every output unreadable to the other
accounts of a shared storage (Ray workers, colleagues) whatever the umask says. Their names,
``.verl_patches-tmp-<16 hex>.<target name>``, are recognisable (`is_temp_name`), so a later run removes
an interrupted run's leftovers (`remove_stale_temps`) and nothing else. Where several processes may write
into one folder, a writer asks for an *owned* temp (``owned=True``): its name also holds the writer's pid and
host, ``.verl_patches-tmp-<16 hex>.<pid>@<host>.<target name>``, so that only the leftovers of a process of
this host that no longer runs are removed (`remove_abandoned_temps`), never a running writer's.

Writers that want a path (``torch.save``, pyarrow, a safetensors writer) use `atomic_path` or
`write_atomically`; writers that want a file object use `atomic_open`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import shutil
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

TMP_PREFIX = ".verl_patches-tmp-"  # + 16 hex digits + "." + the target's name: no user file is named so
_TMP_NAME = re.compile(r"\.verl_patches-tmp-[0-9a-f]{16}\..+", re.DOTALL)
_OWNED_TMP_NAME = re.compile(
    r"\.verl_patches-tmp-[0-9a-f]{16}\.(?P<pid>[0-9]{1,10})@(?P<host>[A-Za-z0-9-]{1,32})\..+", re.DOTALL
)
_NAME_KEEP = 200  # of the target's name in the temp name: the whole temp name stays under 255 bytes
# fsync on a folder is not supported by every filesystem (some network and FUSE mounts); the rename is done
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temp files (`temp_path_for`): the only names a tool removes unasked."""
    return bool(_TMP_NAME.fullmatch(name))


def host_tag() -> str:
    """This host's name as it appears in an owned temp name (letters, digits and '-', at most 32)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def temp_path_for(target: str | os.PathLike, *, owned: bool = False) -> Path:
    """A fresh, empty temp file beside ``target`` (its folder is created), mode 0666 minus the umask;
    ``owned`` puts this process's pid and host in its name (`remove_abandoned_temps`).

    The caller writes it and then calls `commit`, or `discard` on failure; `atomic_path` does both.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    owner = f"{os.getpid()}@{host_tag()}." if owned else ""
    while True:
        path = target.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}.{owner}{target.name[: _NAME_KEEP - len(owner)]}"
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
            return path
        except FileExistsError:
            continue


def temp_dir_for(target: str | os.PathLike) -> Path:
    """A fresh, empty folder beside ``target`` to build it in before `swap_folder_in`, mode 0777 minus the
    umask (``tempfile.mkdtemp``'s 0700 would become the final folder's mode: unreadable to other accounts)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = target.parent / f"{TMP_PREFIX}{secrets.token_hex(8)}.{target.name[:_NAME_KEEP]}"
        try:
            os.mkdir(path, 0o777)
            return path
        except FileExistsError:
            continue


def fsync_dir(folder: str | os.PathLike) -> None:
    """Flush ``folder``'s entries (a rename or a new file in it) to disk; a no-op where the filesystem
    cannot flush a folder."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(tmp: str | os.PathLike, target: str | os.PathLike, *, mode: int | None = None) -> None:
    """Put the written temp file ``tmp`` in place of ``target``, durably: flush it, rename it over
    ``target``, flush the folder. ``mode`` (e.g. the replaced file's) is set first when given."""
    tmp, target = Path(tmp), Path(target)
    if mode is not None:
        os.chmod(tmp, mode)
    _fsync_file(tmp)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def discard(tmp: str | os.PathLike) -> None:
    """Remove a temp file that will not be committed (missing already is fine)."""
    Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike, *, mode: int | None = None) -> Iterator[Path]:
    """``with atomic_path(target) as tmp:`` write ``tmp`` by path; on a clean exit it replaces ``target``
    (`commit`), on an exception it is removed and ``target`` is untouched."""
    tmp = temp_path_for(target)
    try:
        yield tmp
        commit(tmp, target, mode=mode)
    except BaseException:
        discard(tmp)
        raise


@contextlib.contextmanager
def atomic_open(
    target: str | os.PathLike, mode: str = "wb", *, encoding: str | None = None, file_mode: int | None = None
) -> Iterator[IO[Any]]:
    """``with atomic_open(target, "w") as f:`` write ``f``; it replaces ``target`` on a clean exit only.
    ``mode`` is a write mode of `open` ("w", "wb"); text defaults to UTF-8."""
    if not set(mode) <= set("wbt") or "w" not in mode:
        raise ValueError(f"atomic_open({target}): mode {mode!r} is not a write mode ('w' or 'wb')")
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    with atomic_path(target, mode=file_mode) as tmp, open(tmp, mode, encoding=encoding) as f:
        yield f


def write_atomically(target: str | os.PathLike, writer: Callable[[Path], object], *, mode: int | None = None) -> None:
    """Call ``writer(tmp_path)`` and put the result in place of ``target``; the temp file goes on failure."""
    with atomic_path(target, mode=mode) as tmp:
        writer(tmp)


def write_bytes_atomically(target: str | os.PathLike, data: bytes, *, mode: int | None = None) -> None:
    write_atomically(target, lambda p: p.write_bytes(data), mode=mode)


def write_text_atomically(target: str | os.PathLike, text: str, *, mode: int | None = None) -> None:
    write_atomically(target, lambda p: p.write_text(text, encoding="utf-8"), mode=mode)


def write_json_atomically(
    target: str | os.PathLike, data: Any, *, indent: int | None = 2, sort_keys: bool = False
) -> None:
    """``data`` as JSON text and a final newline."""
    write_text_atomically(target, json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")


def copy_file_atomically(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    write_atomically(dst, lambda p: shutil.copyfile(src, p))


def remove_stale_temps(directory: str | os.PathLike) -> int:
    """Delete temp files left by an interrupted run in ``directory`` (not recursive); returns the count.

    Only for a folder one writer owns (an output folder of a conversion): a concurrent writer's temp file
    in the same folder would be removed too."""
    n = 0
    if Path(directory).is_dir():
        for p in Path(directory).iterdir():
            if is_temp_name(p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                n += 1
    return n


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True  # another user's process (alive), or not a pid we can ask about: leave its file
    return True


def is_abandoned_temp(name: str) -> bool:
    """An owned temp name (`temp_path_for` with ``owned``) of a process of this host that no longer runs.
    Another host's temp on shared storage is never judged: its pid means nothing here."""
    m = _OWNED_TMP_NAME.fullmatch(name)
    if m is None or m["host"] != host_tag():
        return False
    pid = int(m["pid"])
    return pid != os.getpid() and not _pid_alive(pid)


def remove_abandoned_temps(directory: str | os.PathLike) -> list[str]:
    """Delete the owned temp files of dead processes of this host in ``directory`` (not recursive), for a
    folder several writers may share; returns the names removed, sorted."""
    removed = []
    if Path(directory).is_dir():
        for p in Path(directory).iterdir():
            if is_abandoned_temp(p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                removed.append(p.name)
    return sorted(removed)


def rename_durably(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Rename ``src`` (a file or a folder) to ``dst`` and flush the folders involved, so the move survives a
    crash. For publishing a folder built beside its final name, or moving one aside to delete it."""
    src, dst = Path(src), Path(dst)
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def swap_folder_in(new_dir: str | os.PathLike, target: str | os.PathLike, old: str | os.PathLike) -> None:
    """Put the finished folder ``new_dir`` at ``target``: an existing ``target`` is first renamed to ``old``
    (on the same filesystem) and deleted after, so a reader sees the old folder or the new one, never half;
    a run killed between the two renames leaves the old folder at ``old`` for the caller to restore."""
    target, old = Path(target), Path(old)
    had_old = target.exists() or target.is_symlink()
    if had_old:
        rename_durably(target, old)
    rename_durably(new_dir, target)
    if had_old:
        shutil.rmtree(old, ignore_errors=True)
