"""Unpack one folder of a wheel, sdist or tar archive into a build directory, keeping exec bits."""

from __future__ import annotations

import os
import stat
import tarfile
import zipfile
from pathlib import Path

from verl_patches.sources.errors import IntegrityError


def _safe_target(dest: Path, rel: str) -> Path:
    target = (dest / rel).resolve()
    if not str(target).startswith(str(dest.resolve()) + os.sep):
        raise IntegrityError(f"archive member escapes the target folder: {rel}")
    return target


def _write(target: Path, data: bytes, executable: bool) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    os.chmod(target, 0o755 if executable else 0o644)


def extract_subdir(archive: Path, subdir: str, dest: Path) -> int:
    """Copy the files under `subdir/` of a .whl/.zip or .tar[.gz] into `dest`. Returns the file count."""
    prefix = subdir.rstrip("/") + "/"
    count = 0
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            for info in z.infolist():
                if info.is_dir() or not info.filename.startswith(prefix):
                    continue
                mode = info.external_attr >> 16
                _write(_safe_target(dest, info.filename[len(prefix):]), z.read(info), bool(mode & stat.S_IXUSR))
                count += 1
    else:
        with tarfile.open(archive) as t:
            for m in t.getmembers():
                if not m.name.startswith(prefix):
                    continue
                rel = m.name[len(prefix):]
                if m.isfile():
                    f = t.extractfile(m)
                    assert f is not None
                    _write(_safe_target(dest, rel), f.read(), bool(m.mode & stat.S_IXUSR))
                    count += 1
                elif m.issym():
                    target = _safe_target(dest, rel)
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
    tmp = archive.with_name(archive.name + ".part")
    with tarfile.open(tmp, "w") as t:
        for path in sorted(src.rglob("*")):
            if "__pycache__" in path.parts or path.is_dir():
                continue
            t.add(path, arcname=f"{arcroot}/{path.relative_to(src).as_posix()}", recursive=False)
    tmp.replace(archive)
