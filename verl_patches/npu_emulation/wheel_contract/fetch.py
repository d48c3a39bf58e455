"""Fetch the pinned torch_npu wheel into the user's wheel cache, its sha256 checked; never install it.

    python -m verl_patches.npu_emulation.wheel_contract.fetch      (setup_cpu_env.sh runs it)

`pip download` fetches exactly the pinned file (no dependencies, binary only, the wheel's own platform and ABI
tags, so the same x86_64 file on any host) through whatever index pip is configured with; the file is checked
against `pin.TORCH_NPU_WHEEL.sha256` before it is put in place atomically. Each process that reads the wheel
(`wheel_bytes`) reaches the cache folder through checked folders only (`verl_patches.base.private_dir`: ours, not
writable by others, no link followed), opens the file without following a link, refuses one others could have
written, and hashes the very bytes it then reads the contract from: a planted or swapped file is refused by name.
The suite runs offline once setup has fetched it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from verl_patches.base.atomic_write import commit, temp_dir_for
from verl_patches.base.private_dir import PrivateDirError, file_not_ours, open_private_dir
from verl_patches.base.user_cache import user_cache_dir
from verl_patches.npu_emulation.wheel_contract.pin import TORCH_NPU_WHEEL, WheelPin

PIN_HOME = "verl_patches/npu_emulation/wheel_contract/pin.py"
FETCH_COMMAND = "python -m verl_patches.npu_emulation.wheel_contract.fetch"
WHEELS = "wheels"  # the folder of the user cache setup_cpu_env.sh installs from
ROOT_HINT = "or set VERL_OVERLAY_CACHE to a folder only you can write"


class WheelError(RuntimeError):
    """The pinned wheel is missing from the cache, or a file is not the pinned one; one line naming the file."""


class WheelMismatch(WheelError):
    """A file's sha256 is not the pin's."""


def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _open_cache(cache: Path | None) -> tuple[int, Path]:
    """The wheel folder's descriptor and path, every level checked: ``cache`` itself when given (a test's folder),
    else the user cache's ``wheels/``."""
    try:
        if cache is not None:
            return open_private_dir(cache, (), root_hint=ROOT_HINT)
        return open_private_dir(user_cache_dir(), (WHEELS,), root_hint=ROOT_HINT)
    except PrivateDirError as err:
        raise WheelError(str(err)) from None


def cached_wheel(pin: WheelPin = TORCH_NPU_WHEEL, cache: Path | None = None) -> Path:
    """Where the pinned wheel lives in the wheel cache (whether or not it is there)."""
    return (cache or user_cache_dir() / WHEELS) / pin.file


def check_hash(data: bytes, where: Path, pin: WheelPin = TORCH_NPU_WHEEL) -> None:
    """WheelMismatch unless ``data`` (read from ``where``) hashes to the pin."""
    found = hashlib.sha256(data).hexdigest()
    if found != pin.sha256:
        raise WheelMismatch(f"{where}: sha256 {found} is not the pinned {pin.sha256} of {pin.file} ({PIN_HOME})")


def wheel_bytes(pin: WheelPin = TORCH_NPU_WHEEL, cache: Path | None = None) -> bytes:
    """The cached wheel's bytes, checked against the pin as read (WheelError when it is absent, not this account's
    regular file, writable by others, or not the pinned file)."""
    fd, folder = _open_cache(cache)
    path = folder / pin.file
    try:
        try:
            handle = os.open(pin.file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            raise WheelError(
                f"{path}: the pinned {pin.project} {pin.version} wheel is not in the wheel cache; fetch it with "
                f"`{FETCH_COMMAND}` (setup_cpu_env.sh does)"
            ) from None
        except OSError as err:
            raise WheelError(
                f"{path}: cannot be opened ({err.strerror}); remove it and run `{FETCH_COMMAND}`"
            ) from None
        with os.fdopen(handle, "rb") as f:
            why = file_not_ours(os.fstat(f.fileno()))
            if why:
                raise WheelError(f"{path}: {why}; remove it and run `{FETCH_COMMAND}`")
            data = f.read()
    finally:
        os.close(fd)
    check_hash(data, path, pin)
    return data


def verified_wheel(pin: WheelPin = TORCH_NPU_WHEEL, cache: Path | None = None) -> Path:
    """The cached wheel's path, after `wheel_bytes` checked it (for tools that want the file itself)."""
    wheel_bytes(pin, cache)
    return cached_wheel(pin, cache)


def pip_download(pin: WheelPin, dest: Path) -> Path:
    """Download exactly the pinned file into ``dest`` with pip; returns its path."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
    for tag in pin.platform_tags:
        command += ["--platform", tag]
    command += ["--python-version", pin.python_version, "--implementation", "cp", "--abi", pin.abi]
    command += ["--dest", str(dest), f"{pin.project}=={pin.version}"]
    proc = subprocess.run(command, capture_output=True, text=True)
    got = dest / pin.file
    if proc.returncode != 0 or not got.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise WheelError(f"{pin.file}: pip download failed (exit {proc.returncode}): {tail[0]}")
    return got


def fetch_wheel(
    pin: WheelPin = TORCH_NPU_WHEEL,
    cache: Path | None = None,
    download: Callable[[WheelPin, Path], Path] = pip_download,
) -> Path:
    """The pinned wheel in the cache: kept when it is already there and checks out, else downloaded beside its
    place, checked, and renamed into place. A download with another sha256 is refused and nothing is kept."""
    target = cached_wheel(pin, cache)
    os.close(_open_cache(cache)[0])  # the folder checked (and created 0700) before anything is put in it
    try:
        wheel_bytes(pin, cache)
        return target
    except WheelMismatch:
        pass  # not the pinned file: fetched again below and replaced only by a file that checks out
    except WheelError:
        if target.exists() or target.is_symlink():
            raise  # a link, another account's file or one others can write: named, never replaced blindly
    staging = temp_dir_for(target)
    try:
        got = download(pin, staging)
        check_hash(got.read_bytes(), got, pin)
        commit(got, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    del argv
    try:
        path = fetch_wheel()
    except (WheelError, OSError) as err:
        print(f"torch_npu wheel: {err}", file=sys.stderr)
        return 1
    print(f"   torch_npu {TORCH_NPU_WHEEL.version} wheel (read by the CPU emulation, never installed): {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
