"""Build npu_device.cpp once and load it: one build per source, flags, Python and torch version, kept in the
user's cache (never in the repo), shared by every process that loads it.

The build folder is ``$XDG_CACHE_HOME/verl_patches/torch_extensions/<torch version>-<hash>`` (``~/.cache``
when XDG_CACHE_HOME is unset); the hash covers the source text, the compiler flags, the extension name, the
Python ABI and the layout of `BUILT_MARK`, so an edit of the source builds anew and a finished build is never
rebuilt; the text that named the folder is copied into it and compiled from there. A folder whose build
finished holds `BUILT_MARK` (written last, atomically), which records the sha256 of the source it was built
from and of the library the build produced: a process that finds it imports the library at once, without
ninja or a compiler, once the library's sha256 is the recorded one. Otherwise it takes an exclusive `flock`
on the folder (released by the kernel however the holder ends), looks again, and builds with
torch.utils.cpp_extension. torch's own lock there (a FileBaton: a file created with O_EXCL, waited on by
polling) is never contended under the flock, and a baton left by a builder that was killed is removed, since
torch would wait for it forever.

The library is code this process runs, so the cache is trusted only as far as nobody else can change it
(`verl_patches.base.private_dir`): the cache root and every level below it must be this account's and not
writable by group/others (created 0700), the walk to the build folder never follows a link, the lock and the
records are opened relative to the checked folder without following links, and `BUILT_MARK` and the library
must be this account's regular files that group/others cannot write. Anything else is refused in one line
(`ExtensionCacheError`) naming the folder or file and the fix; a library that differs from its record is
never loaded and never rebuilt over (a process may have it mapped): the message says to remove the folder.

`python -m verl_patches.npu_emulation.device.build` builds it (setup_cpu_env.sh runs this once) and prints
the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import re
import shutil
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TextIO

import torch

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import write_bytes_atomically, write_json_atomically
from verl_patches.base.private_dir import PrivateDirError, file_not_ours, open_private_dir

EXTENSION_NAME = "verl_npu_device"
SOURCE = Path(__file__).with_name("npu_device.cpp")
CFLAGS = ("-O2",)
BUILT_MARK = "built.json"
BUILT_MARK_LAYOUT = 2  # 2: the library's and the source's sha256 recorded; part of the folder's key
BUILT_MARK_MAX_BYTES = 64 * 1024
FLOCK_NAME = "build.flock"
TORCH_BATON = "lock"  # torch.utils.cpp_extension's FileBaton in the build folder
CACHE_LEVELS = ("verl_patches", "torch_extensions")  # below the cache root, above the build folder
BUILD_COMMAND = "python -m verl_patches.npu_emulation.device.build"
ROOT_HINT = "set XDG_CACHE_HOME to a folder only you can write"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_HASH_BLOCK = 1 << 20


class ExtensionCacheError(RuntimeError):
    """The extension's cache cannot be trusted (a folder or file others can change, a library that is not the
    one its build recorded); one line naming it and the fix."""


_load_lock = threading.Lock()
_module: ModuleType | None = None


def build_dir(source: bytes | None = None) -> Path:
    """The folder this source (npu_device.cpp's text unless given), these flags and this torch build into."""
    key = hashlib.sha256(SOURCE.read_bytes() if source is None else source)
    key.update(
        json.dumps(
            {
                "name": EXTENSION_NAME,
                "cflags": CFLAGS,
                "python": sys.implementation.cache_tag,
                "torch": torch.__version__,
                "built_mark": BUILT_MARK_LAYOUT,
            },
            sort_keys=True,
        ).encode()
    )
    return cache_root().joinpath(*CACHE_LEVELS, f"{torch.__version__}-{key.hexdigest()[:12]}")


def cache_root() -> Path:
    """$XDG_CACHE_HOME, else ~/.cache: the root the extension's cache folders are checked from."""
    return Path(env_registry.text("XDG_CACHE_HOME") or Path.home() / ".cache")


def library_path(folder: Path) -> Path:
    return folder / f"{EXTENSION_NAME}.so"


def is_built(folder: Path) -> bool:
    """Whether ``folder`` holds a finished build (its record and library; whether they check out is
    `load_extension`'s business)."""
    return (folder / BUILT_MARK).is_file() and library_path(folder).is_file()


def loaded_extension() -> ModuleType | None:
    """The extension if this process loaded it, else None (nothing is built or loaded by asking)."""
    return _module


def load_extension(log: TextIO | None = None) -> ModuleType:
    """The extension module, built first if no finished build exists (one progress line on `log`, stderr by
    default, when this process compiles). Loaded once per process."""
    global _module
    with _load_lock:
        if _module is None:
            source = SOURCE.read_bytes()
            folder = build_dir(source)
            with _checked_folder(folder) as fd:
                if _verified_build(fd, folder, source):
                    _module = _import(folder)
                else:
                    _module = _build(fd, folder, source, log or sys.stderr)
        return _module


@contextlib.contextmanager
def _checked_folder(folder: Path) -> Iterator[int]:
    """The build folder's descriptor, opened through checked folders (`open_private_dir`), created 0700 where
    missing; closed when the block ends."""
    root = cache_root()
    try:
        below = folder.relative_to(root).parts
    except ValueError:
        raise ExtensionCacheError(f"npu device emulation: {folder} is not under the cache root {root}") from None
    try:
        fd, _ = open_private_dir(root, below, root_hint=ROOT_HINT)
    except PrivateDirError as err:
        raise ExtensionCacheError(f"npu device emulation: {err}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _open_ours(fd: int, folder: Path, name: str) -> int | None:
    """``name`` in the checked folder, opened without following a link; None when it does not exist.
    ExtensionCacheError unless it is this account's regular file that group/others cannot write."""
    try:
        file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise ExtensionCacheError(
            f"npu device emulation: {folder / name}: cannot be opened without following links ({err.strerror}); "
            f"remove {folder} and run `{BUILD_COMMAND}` to build it again"
        ) from None
    why = file_not_ours(os.fstat(file_fd))
    if why:
        os.close(file_fd)
        fix = f"`chmod go-w {folder / name}`" if "writable" in why else f"remove {folder} and run `{BUILD_COMMAND}`"
        raise ExtensionCacheError(f"npu device emulation: {folder / name}: {why}; {fix}")
    return file_fd


def _sha256_of_fd(file_fd: int) -> str:
    h = hashlib.sha256()
    with os.fdopen(os.dup(file_fd), "rb") as f:
        for block in iter(lambda: f.read(_HASH_BLOCK), b""):
            h.update(block)
    return h.hexdigest()


def _verified_build(fd: int, folder: Path, source: bytes) -> bool:
    """True when the folder holds a finished build whose library is the one its record names; False when no
    build finished there. ExtensionCacheError for a record or library that does not check out."""
    remedy = f"remove {folder} and run `{BUILD_COMMAND}` to build it again"
    mark_fd = _open_ours(fd, folder, BUILT_MARK)
    if mark_fd is None:
        return False
    try:
        with os.fdopen(mark_fd, "rb") as f:
            raw = f.read(BUILT_MARK_MAX_BYTES + 1)
    except OSError as err:
        raise ExtensionCacheError(
            f"npu device emulation: {folder / BUILT_MARK}: unreadable ({err}); {remedy}"
        ) from None
    try:
        if len(raw) > BUILT_MARK_MAX_BYTES:
            raise ValueError(f"more than {BUILT_MARK_MAX_BYTES} bytes")
        record = json.loads(raw.decode("utf-8"))
        if not isinstance(record, dict):
            raise ValueError("not a JSON object")
        recorded = {key: record.get(key) for key in ("source_sha256", "library_sha256")}
        for key, value in recorded.items():
            if not isinstance(value, str) or not _SHA256.fullmatch(value):
                raise ValueError(f"key '{key}' must be a sha256 (64 lower-case hex digits)")
    except ValueError as err:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ExtensionCacheError(f"npu device emulation: {folder / BUILT_MARK}: {err}; {remedy}") from None
    source_sha = hashlib.sha256(source).hexdigest()
    if recorded["source_sha256"] != source_sha:
        raise ExtensionCacheError(
            f"npu device emulation: {folder / BUILT_MARK}: built from source sha256 {recorded['source_sha256']}, "
            f"not {SOURCE.name}'s {source_sha}, which names this folder; {remedy}"
        )
    library = library_path(folder)
    lib_fd = _open_ours(fd, folder, library.name)
    if lib_fd is None:
        raise ExtensionCacheError(f"npu device emulation: {library}: missing, though {BUILT_MARK} records it; {remedy}")
    try:
        found = _sha256_of_fd(lib_fd)
    finally:
        os.close(lib_fd)
    if found != recorded["library_sha256"]:
        raise ExtensionCacheError(
            f"npu device emulation: {library}: sha256 {found} is not the {recorded['library_sha256']} recorded in "
            f"{BUILT_MARK} when it was built; the library changed after its build and is not loaded: {remedy}"
        )
    # Loaded by path below: the folders up to it and the file are this account's alone (checked above), so
    # the name resolves to the bytes just hashed.
    return True


def _seal(fd: int, folder: Path, name: str) -> str:
    """Drop group/other write from a file this build wrote (a umask of 0 would leave it open) and return its
    sha256, read through the same descriptor."""
    file_fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    try:
        st = os.fstat(file_fd)
        if st.st_mode & 0o022:
            os.fchmod(file_fd, stat.S_IMODE(st.st_mode) & ~0o022)
        why = file_not_ours(os.fstat(file_fd))
        if why:
            raise ExtensionCacheError(f"npu device emulation: {folder / name}: {why} after its build")
        return _sha256_of_fd(file_fd)
    finally:
        os.close(file_fd)


def _import(folder: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, library_path(folder))
    if spec is None or spec.loader is None:
        raise ImportError(f"npu device emulation: {library_path(folder)} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(fd: int, folder: Path, source: bytes, log: TextIO) -> ModuleType:
    try:
        lock_fd = os.open(FLOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=fd)
    except OSError as err:
        raise ExtensionCacheError(
            f"npu device emulation: {folder / FLOCK_NAME}: cannot be opened without following links "
            f"({err.strerror}); remove it"
        ) from None
    with os.fdopen(lock_fd, "r+b") as flock:
        why = file_not_ours(os.fstat(lock_fd))
        if why and "writable" not in why:  # its mode does not matter: only the lock on it does
            raise ExtensionCacheError(f"npu device emulation: {folder / FLOCK_NAME}: {why}; remove it")
        fcntl.flock(flock, fcntl.LOCK_EX)  # held until this block ends or the process does
        if _verified_build(fd, folder, source):  # another process built it while this one waited
            return _import(folder)
        try:
            os.unlink(TORCH_BATON, dir_fd=fd)
        except FileNotFoundError:
            pass
        print(
            f"verl_patches: compiling the npu device emulation for torch {torch.__version__} in {folder} "
            "(about a minute, once)",
            file=log,
            flush=True,
        )
        start = time.monotonic()
        # the text the folder is named by, not the file as it may be by now
        copy = folder / SOURCE.name
        write_bytes_atomically(copy, source)
        module = _compile(folder, copy)
        library_sha = _seal(fd, folder, library_path(folder).name)
        write_json_atomically(
            folder / BUILT_MARK,
            {
                "source": str(SOURCE),
                "source_sha256": hashlib.sha256(source).hexdigest(),
                "library_sha256": library_sha,
                "torch": torch.__version__,
                "cflags": list(CFLAGS),
                "build_s": round(time.monotonic() - start, 1),
            },
        )
        _seal(fd, folder, BUILT_MARK)
        return module


def _compile(folder: Path, source: Path) -> ModuleType:
    # lazy: cpp_extension imports setuptools; only a build needs it
    from torch.utils import cpp_extension

    saved_path = os.environ.get("PATH", "")
    venv_bin = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and (Path(venv_bin) / "ninja").exists():
        # requirements.txt installs ninja into the environment, whose bin/ is not on PATH unless activated
        os.environ["PATH"] = os.pathsep.join([venv_bin, saved_path])
    try:
        return cpp_extension.load(
            name=EXTENSION_NAME,
            sources=[str(source)],
            extra_cflags=list(CFLAGS),
            build_directory=str(folder),
            with_cuda=False,
            is_python_module=True,
            verbose=False,
        )
    except Exception as exc:
        raise RuntimeError(
            f"npu device emulation: building {source} failed (it needs a C++17 compiler, `c++` "
            f"or $CXX, and ninja): {exc}"
        ) from exc
    finally:
        os.environ["PATH"] = saved_path


def main() -> int:
    start = time.monotonic()
    try:
        load_extension()
    except ExtensionCacheError as err:
        print(err, file=sys.stderr)
        return 1
    print(f"npu device emulation: {library_path(build_dir())} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
