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

Every step is taken relative to a descriptor of the target's folder, opened once, and the temp is created
with ``O_EXCL | O_NOFOLLOW``: renaming the folder or a level above it meanwhile cannot send the write
elsewhere, and a link planted at the temp's name is never followed. Bytes, text and JSON (`write_bytes_at`,
`write_text_atomically`, `write_json_atomically`) and `atomic_open` write through the descriptor that created
the temp and never reopen it by name; before the rename the temp's name must still name that file, so a link
or file put in its place is never published (`TempReplaced`). ``mode`` given: the temp is 0600 while it is
written and gets ``mode`` just before the rename (a secret is never readable by others, not even half-written).

Writers that only take a path (``torch.save``, pyarrow, a safetensors writer) use `atomic_path` or
`write_atomically`: they open the temp by name, so they belong in folders only this account can change;
the same check refuses a temp swapped while they wrote.
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
import stat
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
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is one of our temp files (`temp_path_for`): the only names a tool removes unasked."""
    return bool(_TMP_NAME.fullmatch(name))


def host_tag() -> str:
    """This host's name as it appears in an owned temp name (letters, digits and '-', at most 32)."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:32] or "host"


def _temp_name(target_name: str, owned: bool) -> str:
    owner = f"{os.getpid()}@{host_tag()}." if owned else ""
    return f"{TMP_PREFIX}{secrets.token_hex(8)}.{owner}{target_name[: _NAME_KEEP - len(owner)]}"


def _single_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"atomic_write: {name!r} is not one file name")
    return name


def _open_folder(folder: Path) -> int:
    """A descriptor of ``folder`` (created when missing): every later step is relative to it, so renaming the
    folder or a level above it meanwhile cannot send the write elsewhere."""
    folder.mkdir(parents=True, exist_ok=True)
    return os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)


def _create_temp(dir_fd: int, target_name: str, *, owned: bool = False, private: bool = False) -> tuple[str, int]:
    """(name, write descriptor) of a new temp file beside ``target_name`` in ``dir_fd``: created exclusively and
    never through a link, 0600 while it is written when ``private`` (its final mode is set before the rename),
    else 0666 minus the umask."""
    while True:
        name = _temp_name(target_name, owned)
        try:
            return name, os.open(name, _CREATE, 0o600 if private else 0o666, dir_fd=dir_fd)
        except FileExistsError:
            continue


def _fsync_folder_fd(dir_fd: int) -> None:
    try:
        os.fsync(dir_fd)
    except OSError as err:
        if err.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise


class TempReplaced(OSError):
    """A temp file that is no longer the one this writer created (a link or another file put in its place);
    it is not put in place. One line naming it."""


def _still_ours(dir_fd: int, name: str, fd: int, shown: str) -> None:
    """``name`` in ``dir_fd`` still names the file created as ``fd`` (not a link, not another file)."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        raise TempReplaced(f"{shown}: removed while being written; not put in place") from None
    if stat.S_ISLNK(st.st_mode):
        raise TempReplaced(f"{shown}: replaced by a symbolic link while being written; not put in place")
    if not os.path.samestat(st, os.fstat(fd)):
        raise TempReplaced(f"{shown}: replaced by another file while being written; not put in place")


@contextlib.contextmanager
def _temp_at(
    dir_fd: int, target_name: str, *, mode: int | None, owned: bool = False, shown_folder: str = "<folder>"
) -> Iterator[tuple[str, int]]:
    """``(temp name, its descriptor)``; on a clean exit the descriptor's file gets ``mode`` (when given), is
    flushed, checked to be what the temp name still names (`TempReplaced` otherwise: a link or file put there
    is never published), renamed over ``target_name`` and the folder flushed, all relative to ``dir_fd``; on an
    exception the temp name is removed. The temp is never reopened by name."""
    tmp, fd = _create_temp(dir_fd, _single_name(target_name), owned=owned, private=mode is not None)
    try:
        yield tmp, fd
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
        _still_ours(dir_fd, tmp, fd, f"{shown_folder}/{tmp}")
        os.replace(tmp, target_name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        _fsync_folder_fd(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_bytes_at(
    dir_fd: int, name: str, data: bytes, *, mode: int | None = None, folder: str | os.PathLike[str] = "<folder>"
) -> None:
    """``data`` put in place as ``name`` in the folder open as ``dir_fd`` (``folder`` is its name in messages),
    through the descriptor of its exclusively created temp (`_temp_at`): a link or file put where the temp or
    the folder was cannot redirect it. ``mode`` as for `commit`."""
    with _temp_at(dir_fd, name, mode=mode, shown_folder=str(folder)) as (_, fd):
        _write_all(fd, data)


def write_text_at(
    dir_fd: int, name: str, text: str, *, mode: int | None = None, folder: str | os.PathLike[str] = "<folder>"
) -> None:
    """`write_bytes_at` of ``text`` as UTF-8."""
    write_bytes_at(dir_fd, name, text.encode("utf-8"), mode=mode, folder=folder)


def create_bytes_at(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o600, folder: str | os.PathLike[str] = "<folder>"
) -> None:
    """``data`` as the new file ``name`` in the folder open as ``dir_fd``, whole or not at all, and only if
    nothing has that name yet (`FileExistsError` otherwise: an existing file, or one another writer created
    first, is never replaced). Written through the descriptor of a temp created ``mode`` from the start, then
    linked to ``name`` (a link, unlike a rename, refuses an existing name) and the temp removed."""
    _single_name(name)
    tmp, fd = _create_temp(dir_fd, name, private=True)
    try:
        if mode != 0o600:
            os.fchmod(fd, mode)
        _write_all(fd, data)
        os.fsync(fd)
        _still_ours(dir_fd, tmp, fd, f"{folder}/{tmp}")
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
    _fsync_folder_fd(dir_fd)


def temp_path_for(target: str | os.PathLike[str], *, owned: bool = False) -> Path:
    """A fresh, empty temp file beside ``target`` (its folder is created), mode 0666 minus the umask;
    ``owned`` puts this process's pid and host in its name (`remove_abandoned_temps`).

    For writers that take a path; the caller writes it and then calls `commit`, or `discard` on failure.
    `atomic_path` does both and refuses a temp swapped while it was written."""
    target = Path(target)
    dir_fd = _open_folder(target.parent)
    try:
        name, fd = _create_temp(dir_fd, target.name, owned=owned)
        os.close(fd)
    finally:
        os.close(dir_fd)
    return target.parent / name


def temp_dir_for(target: str | os.PathLike[str]) -> Path:
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


def fsync_dir(folder: str | os.PathLike[str]) -> None:
    """Flush ``folder``'s entries (a rename or a new file in it) to disk; a no-op where the filesystem
    cannot flush a folder."""
    fd = os.open(folder, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    try:
        _fsync_folder_fd(fd)
    finally:
        os.close(fd)


def _check_regular(fd: int, shown: Path) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise TempReplaced(f"{shown}: not a regular file any more; not put in place")


def commit(tmp: str | os.PathLike[str], target: str | os.PathLike[str], *, mode: int | None = None) -> None:
    """Put the written temp file ``tmp`` (`temp_path_for`) in place of ``target``, durably: flush it, rename it
    over ``target``, flush the folder. ``mode`` (e.g. the replaced file's) is set first when given. A temp
    that has become a link is refused (`TempReplaced`), never followed."""
    tmp, target = Path(tmp), Path(target)
    try:
        fd = os.open(tmp, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError:
        if os.path.islink(tmp):
            raise TempReplaced(f"{tmp}: replaced by a symbolic link while being written; not put in place") from None
        raise
    try:
        _check_regular(fd, tmp)
        if mode is not None:
            os.fchmod(fd, mode)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    fsync_dir(target.parent)


def discard(tmp: str | os.PathLike[str]) -> None:
    """Remove a temp file that will not be committed (missing already is fine)."""
    Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str], *, mode: int | None = None) -> Iterator[Path]:
    """``with atomic_path(target) as tmp:`` write ``tmp`` by path; on a clean exit it replaces ``target``,
    on an exception it is removed and ``target`` is untouched.

    For writers that only take a path (``torch.save``, pyarrow, safetensors), which open it by name: the temp
    name is unguessable, and if it no longer names the file created for it when the writer is done (a link or
    another file put in its place) nothing is put in place (`TempReplaced`). Text, bytes and JSON go through
    `write_bytes_at` and friends, which never open the temp by name."""
    target = Path(target)
    dir_fd = _open_folder(target.parent)
    try:
        with _temp_at(dir_fd, target.name, mode=mode, shown_folder=str(target.parent)) as (name, _):
            yield target.parent / name
    finally:
        os.close(dir_fd)


@contextlib.contextmanager
def atomic_open(
    target: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None, file_mode: int | None = None
) -> Iterator[IO[Any]]:
    """``with atomic_open(target, "w") as f:`` write ``f``; it replaces ``target`` on a clean exit only.
    ``mode`` is a write mode of `open` ("w", "wb"); text defaults to UTF-8. ``f`` writes to the descriptor of
    the exclusively created temp: nothing reopens it by name."""
    if not set(mode) <= set("wbt") or "w" not in mode:
        raise ValueError(f"atomic_open({target}): mode {mode!r} is not a write mode ('w' or 'wb')")
    if "b" not in mode and encoding is None:
        encoding = "utf-8"
    target = Path(target)
    dir_fd = _open_folder(target.parent)
    try:
        with _temp_at(dir_fd, target.name, mode=file_mode, shown_folder=str(target.parent)) as (_, fd):
            with os.fdopen(fd, mode, encoding=encoding, closefd=False) as f:
                yield f
    finally:
        os.close(dir_fd)


def write_atomically(
    target: str | os.PathLike[str], writer: Callable[[Path], object], *, mode: int | None = None
) -> None:
    """Call ``writer(tmp_path)`` and put the result in place of ``target``; the temp file goes on failure
    (`atomic_path`: for writers that only take a path)."""
    with atomic_path(target, mode=mode) as tmp:
        writer(tmp)


def write_bytes_atomically(target: str | os.PathLike[str], data: bytes, *, mode: int | None = None) -> None:
    """``data`` in place of ``target``, written through the temp's descriptor (`write_bytes_at`)."""
    target = Path(target)
    dir_fd = _open_folder(target.parent)
    try:
        write_bytes_at(dir_fd, target.name, data, mode=mode, folder=target.parent)
    finally:
        os.close(dir_fd)


def write_text_atomically(target: str | os.PathLike[str], text: str, *, mode: int | None = None) -> None:
    write_bytes_atomically(target, text.encode("utf-8"), mode=mode)


def write_json_atomically(
    target: str | os.PathLike[str], data: Any, *, indent: int | None = 2, sort_keys: bool = False
) -> None:
    """``data`` as JSON text and a final newline."""
    write_text_atomically(target, json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")


def copy_file_atomically(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    write_atomically(dst, lambda p: shutil.copyfile(src, p))


def remove_stale_temps(directory: str | os.PathLike[str]) -> int:
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


def remove_abandoned_temps(directory: str | os.PathLike[str]) -> list[str]:
    """Delete the owned temp files of dead processes of this host in ``directory`` (not recursive), for a
    folder several writers may share; returns the names removed, sorted."""
    removed = []
    if Path(directory).is_dir():
        for p in Path(directory).iterdir():
            if is_abandoned_temp(p.name) and p.is_file() and not p.is_symlink():
                p.unlink(missing_ok=True)
                removed.append(p.name)
    return sorted(removed)


def rename_durably(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
    """Rename ``src`` (a file or a folder) to ``dst`` and flush the folders involved, so the move survives a
    crash. For publishing a folder built beside its final name, or moving one aside to delete it."""
    src, dst = Path(src), Path(dst)
    os.rename(src, dst)
    fsync_dir(dst.parent)
    if src.parent != dst.parent:
        fsync_dir(src.parent)


def swap_folder_in(
    new_dir: str | os.PathLike[str], target: str | os.PathLike[str], old: str | os.PathLike[str]
) -> None:
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
