"""A component's own test suite at the pin, unpacked beside the sources with the sources' guarantees.

vllm-ascend's sdist (the lock's PyPI artifact for `vllm_ascend`) carries its `tests/` folder. The suite runs a
selection of those tests as a second judge of the torch_npu emulation (tests/vllm_ascend_upstream). The lock says
which folder of the artifact and what its tree hash must be, in the component's `upstream_tests` table:

    [components.vllm_ascend.upstream_tests]
    pypi_subdir = "vllm_ascend-0.9.1/tests"
    tree_sha256 = "<sha256 of the unpacked folder, as treehash.tree_hash computes it>"

`install` finds the artifact (an exported --cache DIR that holds it, else the download cache, else the index,
unless offline), checks its sha256 against the lock, unpacks the folder into a temporary folder with the archive
limits of `extract`, checks the tree hash, and only then swaps it in at `.upstream_tests/<component>/tests` under the
repo root (git-ignored; never inside a package folder). A folder already there whose tree hash matches is kept
as it is. Concurrent installs (two test processes) take a lock file beside it.

    python -m verl_patches.sources.upstream_tests [--component vllm_ascend] [--offline] [--measure]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import swap_folder_in, temp_dir_for
from verl_patches.sources import cache_route, names, pypi_route
from verl_patches.sources.errors import IntegrityError, RouteUnavailable, SourceError
from verl_patches.sources.extract import extract_subdir
from verl_patches.sources.lock import HEX64, Component, Lock, LockError, load_lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.treehash import tree_hash

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10: setup_sources.sh bootstraps tomli
    import tomli as _toml  # type: ignore[no-redef]

TABLE = "upstream_tests"
DIR_NAME = ".upstream_tests"  # at the repo root, beside the package folders; git-ignored
FOLDER = "tests"  # the unpacked folder's name: upstream's tests import themselves as the package `tests`
SOURCES_CACHE_ENV = "VERL_OVERLAY_SOURCES_CACHE"


@dataclass(frozen=True)
class TestsPin:
    component: str
    pypi_subdir: str  # folder of the component's PyPI artifact that becomes `tests/`
    tree_sha256: str


def read_pin(lock: Lock, component: str) -> TestsPin:
    """The `upstream_tests` table of `component` in the lock; LockError naming the key at fault."""
    comp = lock.select([component])[0]
    where = f"{lock.path.name}: components.{component}.{TABLE}"
    table = _toml.loads(lock.path.read_text(encoding="utf-8"))["components"][component].get(TABLE)
    if not isinstance(table, dict):
        raise LockError(f"{where}: missing (the table that pins the component's own tests)")
    if comp.pypi is None:
        raise LockError(f"{where}: the component has no [pypi] artifact to take its tests from")
    subdir, digest = table.get("pypi_subdir"), table.get("tree_sha256")
    if not isinstance(subdir, str):
        raise LockError(f"{where}.pypi_subdir: expected a string, got {type(subdir).__name__}")
    try:
        names.relative_path(subdir)
    except ValueError as e:
        raise LockError(f"{where}.pypi_subdir: {e}") from None
    if not isinstance(digest, str) or not HEX64.match(digest):
        raise LockError(f"{where}.tree_sha256: {digest!r} is not a 64-hex sha256 (measure it with --measure)")
    return TestsPin(component, subdir, digest)


def tests_folder(root: Path, component: str) -> Path:
    """Where `install` puts the component's `tests/` (its parent is the rootdir upstream's tests expect)."""
    return Path(root) / DIR_NAME / names.plain_name(component) / FOLDER


def _artifact(comp: Component, cache: Path, cache_dir: Path | None, offline: bool) -> Path:
    """The component's PyPI artifact, its sha256 checked against the lock."""
    assert comp.pypi is not None
    if cache_dir is not None:
        try:
            origin, path, _ = cache_route.entry_for(cache_dir, comp)  # sha256 checked there
            if origin == "pypi":
                return path
        except RouteUnavailable:
            pass
    path, _ = pypi_route.fetch_artifact(comp.pypi, cache, offline=offline)
    return path


def _matches(folder: Path, digest: str) -> bool:
    return folder.is_dir() and not folder.is_symlink() and tree_hash(folder) == digest


def install(
    root: Path,
    lock: Lock,
    component: str,
    cache: Path | None = None,
    cache_dir: Path | None = None,
    offline: bool = False,
) -> Path:
    """The component's pinned `tests/` folder under `root`, unpacked and checked unless already in place."""
    pin = read_pin(lock, component)
    folder = tests_folder(root, component)
    if _matches(folder, pin.tree_sha256):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / ".install.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes, however this process ends
        if _matches(folder, pin.tree_sha256):  # another process installed it while this one waited
            return folder
        comp = lock.select([component])[0]
        if cache_dir is None and env_registry.text(SOURCES_CACHE_ENV):
            cache_dir = Path(env_registry.text(SOURCES_CACHE_ENV))
        artifact = _artifact(comp, cache or user_cache_dir(), cache_dir, offline)
        staged = temp_dir_for(folder)
        try:
            extract_subdir(artifact, pin.pypi_subdir, staged)
            found = tree_hash(staged)
            if found != pin.tree_sha256:
                raise IntegrityError(
                    f"{artifact.name}: {pin.pypi_subdir}/ unpacks to tree hash {found}, the lock's "
                    f"components.{component}.{TABLE}.tree_sha256 is {pin.tree_sha256}"
                )
            swap_folder_in(staged, folder, folder.parent / f".old.{os.getpid()}")
        finally:
            shutil.rmtree(staged, ignore_errors=True)  # gone already when it was swapped in
    return folder


def measure(lock: Lock, component: str, subdir: str, cache: Path | None = None, offline: bool = False) -> str:
    """Tree hash of `subdir` of the component's PyPI artifact (for writing a new pin into the lock)."""
    comp = lock.select([component])[0]
    if comp.pypi is None:
        raise LockError(f"{lock.path.name}: components.{component} has no [pypi] artifact")
    artifact = _artifact(comp, cache or user_cache_dir(), None, offline)
    staged = temp_dir_for(Path(cache or user_cache_dir()) / "measure" / FOLDER)
    try:
        extract_subdir(artifact, names.relative_path(subdir), staged)
        return tree_hash(staged)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.sources.upstream_tests", description=__doc__.split("\n")[0]
    )
    p.add_argument("--component", default="vllm_ascend")
    p.add_argument("--lock", type=Path, default=Path(__file__).resolve().parents[2] / "sources.lock")
    p.add_argument("--offline", action="store_true", help="use only the download cache and $" + SOURCES_CACHE_ENV)
    p.add_argument("--measure", metavar="SUBDIR", help="print the tree hash of SUBDIR of the artifact and stop")
    args = p.parse_args(argv)
    try:
        lock = load_lock(args.lock)
        if args.measure:
            print(measure(lock, args.component, args.measure, offline=args.offline))
            return 0
        print(install(lock.path.parent, lock, args.component, offline=args.offline))
    except (SourceError, LockError, ValueError) as e:
        print(f"upstream_tests: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
