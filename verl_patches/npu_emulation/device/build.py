"""Build npu_device.cpp once and load it: one build per source, flags, Python and torch version, kept in the
user's cache (never in the repo), shared by every process that loads it.

The build folder is ``$XDG_CACHE_HOME/verl_patches/torch_extensions/<torch version>-<hash>`` (``~/.cache``
when XDG_CACHE_HOME is unset); the hash covers the source text, the compiler flags, the extension name and the
Python ABI, so an edit of the source builds anew and a finished build is never rebuilt; the text that named
the folder is copied into it and compiled from there. A folder whose build finished holds `BUILT_MARK`
(written last, atomically): a process that finds it imports the library at once, without ninja or a compiler.
Otherwise it takes an exclusive `flock` on the folder (released by the kernel however the holder ends), looks
again, and builds with torch.utils.cpp_extension. torch's own lock there (a FileBaton: a file created with
O_EXCL, waited on by polling) is never contended under the flock, and a baton left by a builder that was
killed is removed, since torch would wait for it forever.

`python -m verl_patches.npu_emulation.device.build` builds it (setup_cpu_env.sh runs this once) and prints
the folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import TextIO

import torch

from verl_patches.base.atomic_write import write_bytes_atomically, write_json_atomically
from verl_patches.base.env_flags import env_str

EXTENSION_NAME = "verl_npu_device"
SOURCE = Path(__file__).with_name("npu_device.cpp")
CFLAGS = ("-O2",)
BUILT_MARK = "built.json"
FLOCK_NAME = "build.flock"
TORCH_BATON = "lock"  # torch.utils.cpp_extension's FileBaton in the build folder

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
            },
            sort_keys=True,
        ).encode()
    )
    cache = Path(env_str("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "verl_patches" / "torch_extensions" / f"{torch.__version__}-{key.hexdigest()[:12]}"


def library_path(folder: Path) -> Path:
    return folder / f"{EXTENSION_NAME}.so"


def is_built(folder: Path) -> bool:
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
            _module = _import(folder) if is_built(folder) else _build(folder, source, log or sys.stderr)
        return _module


def _import(folder: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, library_path(folder))
    if spec is None or spec.loader is None:
        raise ImportError(f"npu device emulation: {library_path(folder)} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(folder: Path, source: bytes, log: TextIO) -> ModuleType:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / FLOCK_NAME, "a+") as flock:
        fcntl.flock(flock, fcntl.LOCK_EX)  # held until this block ends or the process does
        if is_built(folder):  # another process built it while this one waited
            return _import(folder)
        (folder / TORCH_BATON).unlink(missing_ok=True)
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
        write_json_atomically(
            folder / BUILT_MARK,
            {
                "source": str(SOURCE),
                "source_sha256": hashlib.sha256(source).hexdigest(),
                "torch": torch.__version__,
                "cflags": list(CFLAGS),
                "build_s": round(time.monotonic() - start, 1),
            },
        )
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
    load_extension()
    print(f"npu device emulation: {library_path(build_dir())} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
