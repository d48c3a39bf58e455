"""Unpack one folder of a wheel, sdist or tar archive into a build directory, keeping exec bits."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path
from typing import IO

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import atomic_path
from verl_patches.base.env_flags import EnvError
from verl_patches.sources.errors import IntegrityError

_CHUNK = 1 << 20


# Upstream package folders are tens of MB; these bounds (defaults in base.env_registry: 128 MiB per file, 1 GiB in
# all, 200,000 members) stop an archive bomb long before the tree hash could (it only runs after extraction). Each
# can be raised for an unusual artifact.
def _limit(name: str) -> int:
    try:
        return env_registry.integer(name)
    except EnvError as err:
        raise IntegrityError(str(err)) from None


def confined_target(dest: Path, rel: str) -> Path:
    """`dest/rel`, refused if it would leave `dest` (through '..', an absolute name or a symlink)."""
    root = dest.resolve()
    target = (dest / rel).resolve()
    if not rel or Path(rel).is_absolute() or not str(target).startswith(str(root) + os.sep):
        raise IntegrityError(f"archive member escapes the target folder: {rel}")
    return target


class _Budget:
    """Running totals of one extraction, checked before and while each member is written."""

    def __init__(self, archive: Path) -> None:
        self.archive, self.total, self.members = archive, 0, 0
        self.max_file = _limit("VERL_OVERLAY_MAX_FILE_BYTES")
        self.max_tree = _limit("VERL_OVERLAY_MAX_TREE_BYTES")
        self.max_members = _limit("VERL_OVERLAY_MAX_MEMBERS")

    def member(self, name: str, declared: int) -> None:
        self.members += 1
        if self.members > self.max_members:
            raise IntegrityError(
                f"{self.archive.name}: more than {self.max_members} members "
                f"(VERL_OVERLAY_MAX_MEMBERS); refusing to unpack it"
            )
        if declared > self.max_file:
            raise IntegrityError(
                f"{self.archive.name}: member {name} declares {declared} bytes, over the "
                f"{self.max_file}-byte limit per file (VERL_OVERLAY_MAX_FILE_BYTES)"
            )

    def add(self, name: str, n: int, written: int) -> None:
        self.total += n
        if written > self.max_file:
            raise IntegrityError(
                f"{self.archive.name}: member {name} exceeds the {self.max_file}-byte limit "
                f"per file (VERL_OVERLAY_MAX_FILE_BYTES)"
            )
        if self.total > self.max_tree:
            raise IntegrityError(
                f"{self.archive.name}: unpacked size exceeds the {self.max_tree}-byte limit "
                f"(VERL_OVERLAY_MAX_TREE_BYTES) at member {name}"
            )


def _write_stream(target: Path, src: IO[bytes], executable: bool, name: str, budget: _Budget) -> None:
    """Copy in chunks (memory stays at one chunk), counting every byte against the limits."""
    target.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(target, "wb") as out:
        while chunk := src.read(_CHUNK):
            written += len(chunk)
            budget.add(name, len(chunk), written)
            out.write(chunk)
    os.chmod(target, 0o755 if executable else 0o644)


def extract_subdir(archive: Path, subdir: str, dest: Path) -> int:
    """Copy the files under `subdir/` of a .whl/.zip or .tar[.gz] into `dest`. Returns the file count.

    Member names are confined to `dest`; sizes are bounded per file and in total while unpacking.
    """
    prefix = subdir.rstrip("/") + "/"
    count = 0
    budget = _Budget(archive)
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                rel = info.filename[len(prefix) :]
                budget.member(info.filename, info.file_size)
                mode = info.external_attr >> 16
                with z.open(info) as src:
                    _write_stream(confined_target(dest, rel), src, bool(mode & stat.S_IXUSR), info.filename, budget)
                count += 1
    else:
        with tarfile.open(archive, "r:*") as t:
            for m in t:  # in order, one member at a time: nothing is read ahead
                budget.member(m.name, m.size if m.isfile() else 0)
                if not m.name.startswith(prefix):
                    continue
                rel = m.name[len(prefix) :]
                if m.isfile():
                    f = t.extractfile(m)
                    assert f is not None
                    _write_stream(confined_target(dest, rel), f, bool(m.mode & stat.S_IXUSR), m.name, budget)
                    count += 1
                elif m.issym():
                    target = confined_target(dest, rel)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.symlink(m.linkname, target)
                    count += 1
    if count == 0:
        raise IntegrityError(f"{archive.name}: no files under '{prefix}'")
    return count


def read_member(archive: Path, subdir: str, rel: str) -> bytes | None:
    """The content of `subdir/rel` in an archive, or None if absent."""
    name = f"{subdir.rstrip('/')}/{rel}"
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            try:
                return z.read(name)
            except KeyError:
                return None
    with tarfile.open(archive) as t:
        try:
            f = t.extractfile(name)
        except KeyError:
            return None
        return f.read() if f else None


def write_tar(src: Path, archive: Path, arcroot: str) -> None:
    """Pack a folder as an uncompressed tar with `arcroot/` as its top folder (for cache exports)."""
    with atomic_path(archive) as tmp, tarfile.open(tmp, "w") as t:
        for path in sorted(src.rglob("*")):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            t.add(path, arcname=f"{arcroot}/{path.relative_to(src).as_posix()}", recursive=False)
