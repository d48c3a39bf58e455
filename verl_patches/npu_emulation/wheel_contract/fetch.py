"""Fetch the pinned torch_npu wheel into the user's wheel cache, its sha256 checked; never install it.

    python -m verl_patches.npu_emulation.wheel_contract.fetch      (setup_cpu_env.sh runs it)

`pip download` fetches exactly the pinned file (no dependencies, binary only, the wheel's own platform and ABI
tags, so the same x86_64 file on any host) through whatever index pip is configured with; the file is checked
against `pin.TORCH_NPU_WHEEL.sha256` before it is put in place atomically. A cached file is checked the same way
each time it is read (`verified_wheel`), so the suite runs offline once setup has fetched it.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from verl_patches.base.atomic_write import commit, temp_dir_for
from verl_patches.base.user_cache import wheel_cache_dir
from verl_patches.npu_emulation.wheel_contract.pin import TORCH_NPU_WHEEL, WheelPin

PIN_HOME = "verl_patches/npu_emulation/wheel_contract/pin.py"
FETCH_COMMAND = "python -m verl_patches.npu_emulation.wheel_contract.fetch"


class WheelError(RuntimeError):
    """The pinned wheel is missing from the cache, or a file is not the pinned one; one line naming the file."""


class WheelMismatch(WheelError):
    """A file's sha256 is not the pin's."""


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def cached_wheel(pin: WheelPin = TORCH_NPU_WHEEL, cache: Path | None = None) -> Path:
    """Where the pinned wheel lives in the wheel cache (whether or not it is there)."""
    return (cache or wheel_cache_dir()) / pin.file


def check_hash(path: Path, pin: WheelPin = TORCH_NPU_WHEEL) -> None:
    """WheelMismatch unless ``path``'s sha256 is the pin's."""
    found = sha256_of(path)
    if found != pin.sha256:
        raise WheelMismatch(f"{path}: sha256 {found} is not the pinned {pin.sha256} of {pin.file} ({PIN_HOME})")


def verified_wheel(pin: WheelPin = TORCH_NPU_WHEEL, cache: Path | None = None) -> Path:
    """The cached wheel, checked against the pin; WheelError when it is absent or not the pinned file."""
    path = cached_wheel(pin, cache)
    if path.is_symlink() or not path.is_file():
        raise WheelError(
            f"{path}: the pinned {pin.project} {pin.version} wheel is not in the wheel cache; fetch it with "
            f"`{FETCH_COMMAND}` (setup_cpu_env.sh does)"
        )
    check_hash(path, pin)
    return path


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
    if target.is_file() and not target.is_symlink():
        try:
            check_hash(target, pin)
            return target
        except WheelMismatch:
            pass  # not the pinned file: fetched again below and replaced only by a file that checks out
    staging = temp_dir_for(target)
    try:
        got = download(pin, staging)
        check_hash(got, pin)
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
