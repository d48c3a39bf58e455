"""Install the CPU environment from the wheel cache, every file checked against `requirements-cpu.lock.json`.

    python -m verl_patches.sources.wheel_cache install --python .venv/bin/python     (setup_cpu_env.sh)

The cache is ``~/.cache/verl_overlay/wheels`` (``$VERL_OVERLAY_CACHE/wheels``): PyPI's files, downloaded once,
installed offline from then on. A file there is code every interpreter of the environment may run, so:

* the cache root and ``wheels/`` must be this account's and not writable by group/others, reached without
  following a link (`verl_patches.base.private_dir`; created 0700 when missing); refused otherwise, naming
  the folder and the fix;
* under an exclusive lock on the folder, each file the lock lists for this host is opened without following
  links, must be this account's regular file that others cannot write, and its sha256 must be the lock's: a
  file with a locked file's name and other bytes is refused by name and nothing is installed. The files that
  pass are hard-linked (the very inode that was hashed) into a fresh private folder, ``.verified``, and that
  folder is all the installers see (``--no-index --find-links``): a stale or planted file of any other name
  never reaches them;
* packages with no file in the cache are fetched first (online): ``pip download --require-hashes`` into a
  fresh private folder, and only files whose sha256 is the lock's are moved into the cache;
* pip installs uv, then uv installs every locked package of this host, both with ``--require-hashes`` over
  the same hash-pinned requirements (`wheel_lock.hashed_requirements`): the installers check each hash again,
  including the sdists of the few packages PyPI has no wheel for (built from the checked sdist). Packages the
  environment's receipt (`install_receipt`) does not vouch for are reinstalled from the checked files, all of
  them on the first run in an environment without one; the receipt is rewritten afterwards.

Offline (no index reachable) the cache alone serves, checked the same way; a missing file is then named.
Standard library only (setup_cpu_env.sh runs it with the system Python).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base.atomic_write import commit
from verl_patches.base.private_dir import PrivateDirError, file_not_ours, open_private_dir
from verl_patches.base.user_cache import user_cache_dir
from verl_patches.sources import install_receipt
from verl_patches.sources.pins import PinError
from verl_patches.sources.wheel_lock import (
    LOCK,
    PYTHON,
    LockError,
    WheelLock,
    check_fresh,
    hashed_requirements,
    host_platform,
    read_expected_pins,
    read_lock,
)

WHEELS = "wheels"
VERIFIED = ".verified"  # what the installers see: hard links of the checked files
DOWNLOAD = ".download"  # where pip downloads before the checked files move into the cache
FLOCK = ".install.lock"
REQUIREMENTS_NAME = ".requirements.txt"  # inside VERIFIED: no installer takes a .txt for a distribution
ROOT_HINT = "set VERL_OVERLAY_CACHE to a folder only you can write"
_OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class WheelCacheError(RuntimeError):
    """The wheel cache cannot be used as it is, or the install failed; one line naming the folder or file."""


@dataclass(frozen=True)
class Environment:
    python: Path
    prefix: Path  # the environment's root (sys.prefix)
    site_packages: Path
    version: str  # "3.11"


def environment_of(python: Path) -> Environment:
    """What ``python`` installs into (it runs once to say)."""
    code = (
        "import json, sys, sysconfig; print(json.dumps({'prefix': sys.prefix, "
        "'purelib': sysconfig.get_paths()['purelib'], 'version': '%d.%d' % sys.version_info[:2]}))"
    )
    proc = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise WheelCacheError(f"{python}: does not run ({(proc.stderr.strip().splitlines() or ['no output'])[-1]})")
    info = json.loads(proc.stdout)
    if info["version"] != PYTHON:
        raise WheelCacheError(
            f"{python} is Python {info['version']}; {LOCK.name} holds the files of CPython {PYTHON} "
            f"(PYTHON=/path/to/python{PYTHON} bash verl_patches/scripts/setup_cpu_env.sh, after removing .venv)"
        )
    return Environment(python, Path(info["prefix"]), Path(info["purelib"]), info["version"])


def open_cache(root: Path | None = None) -> tuple[int, Path]:
    """The wheel cache's descriptor and path, every level checked (`open_private_dir`)."""
    try:
        return open_private_dir(root or user_cache_dir(), (WHEELS,), root_hint=ROOT_HINT)
    except PrivateDirError as err:
        raise WheelCacheError(str(err)) from None


def _fresh_folder(cache_fd: int, name: str) -> int:
    """An empty private folder ``name`` in the cache (a leftover of a killed run is removed first)."""
    try:
        shutil.rmtree(name, dir_fd=cache_fd)
    except FileNotFoundError:
        pass
    except OSError:  # not a folder (a file or a link in its place): rmtree refuses links, unlink never follows one
        os.unlink(name, dir_fd=cache_fd)
    os.mkdir(name, 0o700, dir_fd=cache_fd)
    return os.open(name, _DIR, dir_fd=cache_fd)


def _sha256_fd(fd: int) -> str:
    with os.fdopen(os.dup(fd), "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _link_or_copy(fd: int, name: str, dest_fd: int) -> None:
    """Put the open file ``fd`` into the folder ``dest_fd`` as ``name``: a hard link to that very inode
    (through /proc, so no name is resolved again), or a copy read through ``fd`` where links are refused."""
    try:
        os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dest_fd)
        return
    except OSError:
        pass
    out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dest_fd)
    with os.fdopen(os.dup(fd), "rb") as src, os.fdopen(out, "wb") as dst:
        src.seek(0)
        shutil.copyfileobj(src, dst, 1 << 20)


def verify_into(cache_fd: int, cache: Path, dest_fd: int, lock: WheelLock, platform_name: str) -> dict[str, list[str]]:
    """Check every file of the lock for ``platform_name`` that the cache holds and put those that pass into
    ``dest_fd``; package -> the sha256 of its files put there. WheelCacheError names a file that does not pass."""
    staged: dict[str, list[str]] = {}
    for package in lock.for_platform(platform_name):
        for locked in package.files_for(platform_name):
            path = cache / locked.file
            try:
                fd = os.open(locked.file, _OPEN_FILE, dir_fd=cache_fd)
            except FileNotFoundError:
                continue
            except OSError as err:
                raise WheelCacheError(
                    f"{path}: cannot be opened without following links ({err.strerror}); remove it (`rm {path}`)"
                ) from None
            try:
                why = file_not_ours(os.fstat(fd))
                if why:
                    fix = f"`chmod go-w {path}`" if "writable" in why else f"remove it (`rm {path}`)"
                    raise WheelCacheError(f"{path}: {why}; {fix}")
                found = _sha256_fd(fd)
                if found != locked.sha256:
                    raise WheelCacheError(
                        f"{path}: sha256 {found} is not the {locked.sha256} that {LOCK.name} holds for "
                        f"{package.name} {package.version}; a file that is not PyPI's is never installed: remove it "
                        f"(`rm {path}`) and set up again to fetch the locked file"
                    )
                _link_or_copy(fd, locked.file, dest_fd)
            finally:
                os.close(fd)
            staged.setdefault(package.name, []).append(locked.sha256)
    return staged


def missing_packages(lock: WheelLock, platform_name: str, staged: dict[str, list[str]]) -> list[str]:
    return [p.name for p in lock.for_platform(platform_name) if p.name not in staged]


def _tail(proc: subprocess.CompletedProcess) -> str:
    lines = [line.strip() for line in (proc.stderr or proc.stdout or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def fill(cache_fd: int, cache: Path, lock: WheelLock, platform_name: str, names: list[str], python: Path) -> None:
    """Download the lock's files of ``names`` with pip (hash-checked) and move the files whose sha256 is the
    lock's into the cache."""
    download_fd = _fresh_folder(cache_fd, DOWNLOAD)
    try:
        download = cache / DOWNLOAD
        requirements = download / REQUIREMENTS_NAME
        requirements.write_text(hashed_requirements(lock, platform_name, set(names)), encoding="utf-8")
        command = [str(python), "-m", "pip", "download", "--quiet", "--progress-bar", "off"]
        command += ["--disable-pip-version-check", "--require-hashes", "--no-deps", "-d", str(download)]
        proc = subprocess.run([*command, "-r", str(requirements)], capture_output=True, text=True)
        if proc.returncode != 0:
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            raise WheelCacheError(
                f"{len(names)} package(s) are not in the wheel cache {cache} ({shown}) and pip could not fetch "
                f"them (exit {proc.returncode}): {_tail(proc)}"
            )
        wanted = {f.file: f.sha256 for p in lock.for_platform(platform_name) if p.name in names for f in p.files}
        for name in sorted(os.listdir(download_fd)):
            if name not in wanted:
                continue
            fd = os.open(name, _OPEN_FILE, dir_fd=download_fd)
            try:
                ok = file_not_ours(os.fstat(fd)) is None and _sha256_fd(fd) == wanted[name]
            finally:
                os.close(fd)
            if ok:
                commit(download / name, cache / name)
    finally:
        os.close(download_fd)
        shutil.rmtree(DOWNLOAD, dir_fd=cache_fd, ignore_errors=True)


def _run(command: list[str], what: str) -> None:
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise WheelCacheError(f"{what} failed (exit {proc.returncode}): {_tail(proc)}")


def install_checked(env: Environment, verified: Path, lock: WheelLock, platform_name: str) -> list[str] | None:
    """pip installs uv, uv installs the rest; both from ``verified`` only, both with --require-hashes. Returns
    the packages reinstalled because the receipt did not vouch for them (None: all of them)."""
    reinstall = install_receipt.to_reinstall(env.prefix, env.site_packages, lock, platform_name)
    uv_requirements = verified / ".uv-requirements.txt"
    uv_requirements.write_text(hashed_requirements(lock, platform_name, {"uv"}), encoding="utf-8")
    requirements = verified / REQUIREMENTS_NAME
    requirements.write_text(hashed_requirements(lock, platform_name), encoding="utf-8")
    # --isolated: no find-links or index from pip's environment variables and config files, only `verified`
    pip = [str(env.python), "-m", "pip", "--isolated", "install", "--quiet", "--disable-pip-version-check"]
    pip.append("--require-hashes")
    pip += ["--no-index", "--find-links", str(verified), "--no-deps"]
    if reinstall is None or "uv" in reinstall:
        pip.append("--force-reinstall")
    _run([*pip, "-r", str(uv_requirements)], f"pip install of uv from {verified}")
    uv = [str(env.prefix / "bin" / "uv"), "pip", "install", "--quiet", "--no-config", "--python", str(env.python)]
    # --no-cache: uv's own cache would be one more folder of code to trust; the copy and the bytecode as before
    uv += ["--no-cache", "--link-mode", "copy", "--compile-bytecode", "--require-hashes"]
    uv += ["--no-index", "--find-links", str(verified), "-r", str(requirements)]
    again = [p.name for p in lock.for_platform(platform_name)] if reinstall is None else reinstall
    for name in again:
        if name != "uv":  # uv does not replace itself while it runs; pip did above
            uv += ["--reinstall-package", name]
    _run(uv, f"uv pip install from {verified}")
    return reinstall


def install(python: Path, root: Path | None = None, log=sys.stdout) -> int:
    """The whole install (`main`'s `install`); returns how many packages the lock has for this host."""
    platform_name = host_platform()
    lock = read_lock()
    check_fresh(lock, read_expected_pins())
    env = environment_of(python)
    cache_fd, cache = open_cache(root)
    try:
        try:
            lock_fd = os.open(FLOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=cache_fd)
        except OSError as err:
            raise WheelCacheError(
                f"{cache / FLOCK}: cannot be opened without following links ({err.strerror}); remove it"
            ) from None
        with os.fdopen(lock_fd, "r+b") as flock:
            fcntl.flock(flock, fcntl.LOCK_EX)
            start = time.monotonic()
            staged = _stage(cache_fd, cache, lock, platform_name)
            missing = missing_packages(lock, platform_name, staged)
            if missing:
                print(
                    f"   filling the wheel cache {cache}: {len(missing)} package(s) (the first time about 3.5 GB)",
                    file=log,
                    flush=True,
                )
                fill(cache_fd, cache, lock, platform_name, missing, env.python)
                staged = _stage(cache_fd, cache, lock, platform_name)
                still = missing_packages(lock, platform_name, staged)
                if still:
                    raise WheelCacheError(f"{cache}: no file of {', '.join(still[:5])} after fetching them")
            checked_s = time.monotonic() - start
            checked = "fetch and check" if missing else "check"
            try:
                reinstalled = install_checked(env, cache / VERIFIED, lock, platform_name)
                install_receipt.write_receipt(env.prefix, env.site_packages, lock, platform_name, staged)
            finally:
                shutil.rmtree(VERIFIED, dir_fd=cache_fd, ignore_errors=True)
    finally:
        os.close(cache_fd)
    count = len(lock.for_platform(platform_name))
    again = "all" if reinstalled is None else str(len(reinstalled))
    print(
        f"   {count} packages from {cache}, every file's sha256 as {LOCK.name} ({checked_s:.0f} s to {checked}); "
        f"{again} (re)installed",
        file=log,
    )
    return count


def _stage(cache_fd: int, cache: Path, lock: WheelLock, platform_name: str) -> dict[str, list[str]]:
    verified_fd = _fresh_folder(cache_fd, VERIFIED)
    try:
        return verify_into(cache_fd, cache, verified_fd, lock, platform_name)
    finally:
        os.close(verified_fd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m verl_patches.sources.wheel_cache", description=__doc__.split("\n\n")[0]
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    inst = sub.add_parser("install", help="install the lock's packages for this host from the wheel cache")
    inst.add_argument("--python", type=Path, required=True, help="the environment's interpreter (.venv/bin/python)")
    args = ap.parse_args(argv)
    try:
        install(args.python)
        return 0
    except (WheelCacheError, LockError, PinError) as err:
        print(f"wheel cache: {err}", file=sys.stderr)
        return 1
    except OSError as err:  # a folder or file of the cache that cannot be read or written
        print(f"wheel cache: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
