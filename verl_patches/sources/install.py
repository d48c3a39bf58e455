"""Populate package folders from the lock: build beside the target, verify, then swap in by rename."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import rename_durably, swap_folder_in, temp_dir_for, write_bytes_atomically
from verl_patches.sources import cache_route, git_route, names, prelude_line, pypi_route
from verl_patches.sources.errors import IntegrityError, LocalEditsError, RouteUnavailable, SourceError
from verl_patches.sources.extract import extract_subdir, write_tar
from verl_patches.sources.folder_check import check_folder, prelude_relpath, pristine_filters
from verl_patches.sources.lock import Component, Lock, rewrite_tree_hash
from verl_patches.sources.manifests import load_manifest, save_manifest
from verl_patches.sources.paths import BUILD_DIR_NAME
from verl_patches.sources.required_parts import describe_missing, missing_subfolders
from verl_patches.sources.state import load_state, save_state
from verl_patches.sources.treehash import combine, compare, file_hashes


@dataclass
class SetupOptions:
    root: Path
    lock: Lock
    cache: Path  # the user download cache
    routes: list[str]  # tried in order
    cache_dir: Path | None = None  # an exported artifact directory (--cache)
    index_url: str | None = None
    mirrors: dict[str, list[str]] = field(default_factory=dict)  # component -> URLs tried first
    offline: bool = False
    force: bool = False
    device: str = "cpu"


@dataclass
class Outcome:
    component: str
    status: str  # unchanged | installed | prelude-inserted | missing | failed | exported | relocked
    route: str | None = None
    detail: str = ""
    attempts: list[str] = field(default_factory=list)
    optional_here: bool = False


@dataclass
class Built:
    route: str
    origin_route: str  # git or pypi: whose tree hash applies (differs from route for the cache route)
    tree_dir: Path
    provenance: dict


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class BadMirror(SourceError):
    """A mirror from --mirror or VERL_OVERLAY_GIT_MIRROR_* that is not an allowed git URL."""


def git_urls(opts: SetupOptions, comp: Component) -> list[str]:
    """Mirrors first (environment, then flags), then the lock's URLs; every one allow-listed."""
    var = f"VERL_OVERLAY_GIT_MIRROR_{comp.name.upper()}"
    sources = [(u, var) for u in env_registry.items(var)]
    sources += [(u, f"--mirror {comp.name}=") for u in opts.mirrors.get(comp.name, [])]
    for url, origin in sources:
        try:
            names.git_url(url)
        except ValueError as e:
            raise BadMirror(f"{origin}: {e}") from None
    extra = [u for u, _ in sources]
    return extra + [u for u in comp.git_urls if u not in extra]


def _materialize(opts: SetupOptions, comp: Component, route: str, dest: Path) -> Built:
    """Produce the pristine folder of `comp` through one route into `dest` (no hash check here)."""
    if route == "git":
        fetched = git_route.fetch_commit(comp, opts.cache, git_urls(opts, comp), opts.offline)
        for line in fetched.attempts:
            log(f"  {comp.name}: {line}")
        log(
            f"  {comp.name}: exporting {comp.git_subdir}/ at {comp.commit[:12]}"
            + (f" (fetched from {fetched.url})" if fetched.url else " (git cache)")
        )
        git_route.export_tree(fetched.git_dir, comp.commit, comp.git_subdir, dest)
        return Built(
            "git",
            "git",
            dest,
            {
                "route": "git",
                "git_dir": str(fetched.git_dir),
                "commit": comp.commit,
                "subdir": comp.git_subdir,
                "source": fetched.url or "cache",
            },
        )
    if route == "pypi":
        if comp.pypi is None:
            raise RouteUnavailable("no PyPI artifact exists for this component (git only)")
        path, source = pypi_route.fetch_artifact(comp.pypi, opts.cache, opts.index_url, opts.offline)
        log(f"  {comp.name}: unpacking {comp.pypi.file} ({'cached' if source == 'cache' else 'downloaded'})")
        extract_subdir(path, comp.pypi.subdir, dest)
        return Built(
            "pypi", "pypi", dest, {"route": "pypi", "artifact": str(path), "subdir": comp.pypi.subdir, "source": source}
        )
    if route == "cache":
        if opts.cache_dir is None:
            raise RouteUnavailable("no --cache DIR given")
        origin, path, entry = cache_route.entry_for(opts.cache_dir, comp)  # sha256 checked there
        if origin == "pypi":
            assert comp.pypi is not None
            subdir = comp.pypi.subdir
        else:
            subdir = entry.get("subdir", comp.package)
        log(f"  {comp.name}: unpacking {path.name} from {opts.cache_dir}")
        extract_subdir(path, subdir, dest)
        return Built(
            "cache",
            origin,
            dest,
            {"route": "cache", "origin_route": origin, "artifact": str(path), "subdir": subdir, "commit": comp.commit},
        )
    raise ValueError(f"unknown route {route!r}")


def _check_tree(opts: SetupOptions, comp: Component, built: Built) -> str:
    found = combine(file_hashes(built.tree_dir))
    expected = comp.tree_sha256.get(built.origin_route, "")
    if not expected:
        raise IntegrityError(
            f"{comp.name}: the lock has no {built.origin_route} tree hash; "
            f"run setup_sources.sh --relock --route {built.origin_route} --only {comp.name}"
        )
    if found != expected:
        manifest = load_manifest(opts.lock.path, comp.name, built.origin_route)
        detail = ""
        if manifest is not None:
            diff = compare(manifest, file_hashes(built.tree_dir))
            names = [f"{k}: {p}" for k, v in diff.items() for p in v]
            detail = "; differing files: " + ", ".join(names[:15]) + (" …" if len(names) > 15 else "")
        raise IntegrityError(
            f"{comp.name}: {built.route} tree hash {found} differs from the lock's "
            f"{built.origin_route} hash {expected}{detail}"
        )
    return found


def build_component(
    opts: SetupOptions, comp: Component, workdir: Path, check: bool = True, need_on: Iterable[str] = ()
) -> tuple[Built | None, list[str]]:
    """Try each route in order; return the first verified build and the failed attempts.

    A tree that lacks a subfolder the jobs of a device in `need_on` import (the lock's ``subfolders_needed_on``)
    is refused like an unreachable route, so the next route is tried."""
    attempts: list[str] = []
    for route in opts.routes:
        dest = temp_dir_for(workdir / f"{comp.package}.{route}")  # becomes the package folder: the umask's mode
        try:
            built = _materialize(opts, comp, route, dest)
            if check:
                _check_tree(opts, comp, built)
            missing = missing_subfolders(comp, built.tree_dir, need_on)
            if missing:
                attempts.append(f"{route}: REFUSED: {describe_missing(comp, missing)}")
                log(f"  {comp.name}: {route}: REFUSED: {describe_missing(comp, missing)}")
                shutil.rmtree(dest, ignore_errors=True)
                continue
            return built, attempts
        except RouteUnavailable as e:
            attempts.append(f"{route}: {e}")
        except IntegrityError as e:
            attempts.append(f"{route}: INTEGRITY ERROR: {e}")
            log(f"  {comp.name}: {route}: INTEGRITY ERROR: {e}")
        shutil.rmtree(dest, ignore_errors=True)
    return None, attempts


def _insert_prelude(lock: Lock, comp: Component, folder: Path) -> bool:
    rel = prelude_relpath(lock, comp)
    if rel is None:
        return False
    target = folder / rel
    if not target.is_file():
        raise IntegrityError(f"{lock.prelude_file}: the file to receive the prelude line is missing")
    data = target.read_bytes()
    new = prelude_line.insert(data, lock.prelude_line, str(target))
    if new == data:
        return False
    write_bytes_atomically(target, new, mode=target.stat().st_mode & 0o777)
    return True


def _recover_interrupted_swap(root: Path, comp: Component) -> None:
    """If a previous run died between its two renames, put the old folder back."""
    folder = root / comp.package
    build = root / BUILD_DIR_NAME
    if not build.is_dir():
        return
    olds = sorted(build.glob(f"{comp.package}.old.*"))
    if not olds:
        return
    if folder.exists():  # the swap completed but the run died before removing the old copy
        for old in olds:
            shutil.rmtree(old, ignore_errors=True)
        return
    rename_durably(olds[-1], folder)
    log(f"  {comp.name}: restored {comp.package}/ from an interrupted earlier run")


def _package_folder(root: Path, comp: Component) -> Path:
    """root/package, refused unless it is a direct child of root (the lock allow-lists the name too)."""
    folder = root / names.package_folder(comp.package)
    if folder.parent.resolve() != root.resolve():
        raise SourceError(f"{comp.package!r}: the package folder must be a direct child of {root}")
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise SourceError(f"{folder}: exists and is not a folder (a file or a link); it is never replaced")
    return folder


def _swap_in(root: Path, comp: Component, new_dir: Path) -> None:
    folder = _package_folder(root, comp)
    build = root / BUILD_DIR_NAME
    swap_folder_in(new_dir, folder, build / f"{comp.package}.old.{os.getpid()}")


def setup_component(opts: SetupOptions, comp: Component, state: dict) -> Outcome:
    root = opts.root
    optional = opts.device not in comp.needed_on
    _recover_interrupted_swap(root, comp)
    rep = check_folder(root, opts.lock, comp, state.get(comp.name, {}).get("origin_route"))
    # a pristine tree of a route that lacks what this host's jobs import (megatron-core's wheel on an NPU host) is
    # rebuilt from a route that has it: nothing of the user's is lost, it equals what its route pins
    incomplete = rep.exists and rep.pristine and bool(missing_subfolders(comp, root / comp.package, [opts.device]))
    if rep.exists and rep.pristine and not opts.force and not incomplete:
        inserted = _insert_prelude(opts.lock, comp, root / comp.package)
        entry = state.setdefault(comp.name, {})
        if entry.get("tree_sha256") != rep.tree_sha256:
            entry.update(
                {
                    "tree_sha256": rep.tree_sha256,
                    "origin_route": rep.matched_route,
                    "route": entry.get("route", rep.matched_route),
                }
            )
        return Outcome(
            comp.name,
            "prelude-inserted" if inserted else "unchanged",
            entry.get("route"),
            f"matches the lock ({rep.matched_route} tree)",
            optional_here=optional,
        )
    if rep.exists and not rep.pristine and not opts.force:
        lines = rep.difference_lines() or [f"tree hash {rep.tree_sha256} matches no route in the lock"]
        raise LocalEditsError(
            f"{comp.package}/ differs from the lock and was left as it is (use --force to "
            f"replace it):\n    " + "\n    ".join(lines)
        )
    build = root / BUILD_DIR_NAME
    build.mkdir(exist_ok=True)
    built, attempts = build_component(opts, comp, build, need_on=[opts.device])
    if built is None:
        status = "missing" if not rep.exists else "failed"
        return Outcome(comp.name, status, None, "no route could supply it", attempts, optional_here=optional)
    _insert_prelude(opts.lock, comp, built.tree_dir)
    _swap_in(root, comp, built.tree_dir)
    state[comp.name] = {
        **built.provenance,
        "origin_route": built.origin_route,
        "tree_sha256": comp.tree_sha256[built.origin_route],
    }
    return Outcome(
        comp.name, "installed", built.route, str(built.provenance.get("source", "")), attempts, optional_here=optional
    )


def setup(opts: SetupOptions, names: list[str] | None = None) -> list[Outcome]:
    opts.root.mkdir(parents=True, exist_ok=True)  # a fresh --root for an empty install
    state = load_state(opts.root)
    outcomes = []
    build = opts.root / BUILD_DIR_NAME
    try:
        for comp in opts.lock.select(names):
            log(f"{comp.name}: {comp.ref} @ {comp.commit[:12]}")
            try:
                outcomes.append(setup_component(opts, comp, state))
            except SourceError as e:
                outcomes.append(
                    Outcome(comp.name, "failed", None, str(e), optional_here=opts.device not in comp.needed_on)
                )
    finally:
        save_state(opts.root, state)
        if build.is_dir():
            for leftover in build.iterdir():
                if ".old." not in leftover.name:
                    shutil.rmtree(leftover, ignore_errors=True)
            if not any(build.iterdir()):
                build.rmdir()
    return outcomes


def export_cache(opts: SetupOptions, dest: Path, names: list[str] | None = None) -> list[Outcome]:
    """Write every selected component's artifact into `dest` for an air-gapped install with --cache."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    outcomes = []
    routes = [r for r in opts.routes if r != "cache"] or ["git", "pypi"]
    with tempfile.TemporaryDirectory(prefix="export.", dir=dest) as work:
        o2 = SetupOptions(**{**opts.__dict__, "routes": routes})
        for comp in opts.lock.select(names):
            log(f"{comp.name}: exporting")
            # the cache is for the cluster, whatever this host is: every device's subfolders must be in it
            built, attempts = build_component(o2, comp, Path(work), need_on=comp.subfolders_needed_on)
            if built is None:
                outcomes.append(
                    Outcome(
                        comp.name,
                        "missing",
                        None,
                        "no route could supply it",
                        attempts,
                        optional_here=opts.device not in comp.needed_on,
                    )
                )
                continue
            if built.route == "pypi":
                assert comp.pypi is not None
                pypi_route.copy_into(Path(built.provenance["artifact"]), dest)
                entry = {"route": "pypi", "file": comp.pypi.file, "sha256": comp.pypi.sha256}
            else:
                name = f"{comp.name}-{comp.commit}.tar"
                write_tar(built.tree_dir, dest / name, comp.package)
                entry = {
                    "route": "git",
                    "file": name,
                    "commit": comp.commit,
                    "subdir": comp.package,
                    "sha256": pypi_route.sha256_file(dest / name),
                }
            cache_route.write_index(dest, {comp.name: entry})
            outcomes.append(Outcome(comp.name, "exported", built.route, entry["file"], attempts))
    return outcomes


def relock(opts: SetupOptions, names: list[str] | None = None) -> list[Outcome]:
    """Recompute tree hashes and per-file manifests for every route that can be reached, and write them."""

    outcomes = []
    with tempfile.TemporaryDirectory(prefix="relock.") as work:
        for comp in opts.lock.select(names):
            done, attempts = [], []
            for route in [r for r in opts.routes if r in ("git", "pypi")]:
                o1 = SetupOptions(**{**opts.__dict__, "routes": [route]})
                built, failed = build_component(o1, comp, Path(work), check=False)
                attempts += failed
                if built is None:
                    continue
                files = file_hashes(built.tree_dir)
                save_manifest(opts.lock.path, comp.name, route, files)
                rewrite_tree_hash(opts.lock.path, comp.name, route, combine(files))
                done.append(f"{route}={combine(files)[:16]}…")
                shutil.rmtree(built.tree_dir, ignore_errors=True)
            outcomes.append(Outcome(comp.name, "relocked" if done else "missing", None, ", ".join(done), attempts))
    return outcomes


__all__ = ["SetupOptions", "Outcome", "setup", "export_cache", "relock", "pristine_filters"]
