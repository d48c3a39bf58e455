"""Distribution metadata for the vendored vLLM and vllm-ascend folders (generated `.dist-info` folders).

Why: the package folders at the repo root are plain source trees. verl asks `importlib.metadata` for
vLLM's version (PackageNotFoundError otherwise), and vLLM finds its device through entry points
(`vllm.platform_plugins`: vllm-ascend's `ascend = vllm_ascend:register`; `vllm.general_plugins`), which
exist only as installed distribution metadata. Without them vLLM runs on `UnspecifiedPlatform`.

What: for each component listed in `DISTRIBUTIONS`, a `<name>-<version>.dist-info/` folder (METADATA,
entry_points.txt exactly as upstream declares them at the pin, top_level.txt, INSTALLER, RECORD listing
only the metadata files, so `pip uninstall` can never delete the upstream tree) inside `DIST_DIR_NAME`
at the repo root. Nothing is copied into site-packages and no upstream folder is touched. The folder is
git-ignored; `path_entry()` is what launchers put on PYTHONPATH (every process and vLLM's
model-inspection subprocess, which inherits the environment).

Where the entry points come from (never re-typed): the pinned sdist's `<pkg>.egg-info/entry_points.txt`
(PyPI route, or the cache route with a PyPI artifact), or, for the git route, `pyproject.toml`
(`[project.scripts]`, `[project.entry-points.*]`) and the literal `entry_points=` of `setup.py` at the
locked commit. Standard library only, like the rest of `verl_patches.sources`.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from verl_patches.base.atomic_write import swap_folder_in, temp_dir_for
from verl_patches.sources import git_route
from verl_patches.sources.errors import SourceError
from verl_patches.sources.extract import read_member
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.pypi_route import cached_artifact
from verl_patches.sources.state import load_state

if TYPE_CHECKING:
    from verl_patches.sources.lock import Component, Lock
# The readers of artifacts (git, archives, state) are imported where used: launchers import this module
# only for `path_entry`, which must stay cheap and independent of the fetch machinery.

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10: setup_sources.sh bootstraps tomli
    import tomli as _toml  # type: ignore[no-redef]

DIST_DIR_NAME = ".overlay_dist"
# lock component -> distribution name (the PyPI project name, as importlib.metadata looks it up)
DISTRIBUTIONS = {"vllm": "vllm", "vllm_ascend": "vllm_ascend"}
INSTALLER = "verl-patches (generated from sources.lock; no files outside this folder)"
PROVENANCE_FILE = "verl_patches_provenance.json"


class DistInfoError(SourceError):
    """The metadata cannot be generated or does not match the pin; the message names component and file."""


@dataclass(frozen=True)
class DistSpec:
    component: str
    name: str  # distribution name
    version: str
    top_level: str
    entry_points: str  # entry_points.txt text, normalised
    source: str  # where the entry points were read (artifact path + member, or git commit + file)

    @property
    def folder_name(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}.dist-info"


def dist_dir(root: Path) -> Path:
    return Path(root) / DIST_DIR_NAME


def path_entry(root: Path) -> str:
    """The sys.path / PYTHONPATH entry that makes the generated distributions visible."""
    return str(dist_dir(root).resolve())


def put_on_path(root: Path) -> bool:
    """Make the generated distributions visible in this process and the processes it starts (True when they
    exist). Every process with the overlay then discovers vllm-ascend's platform and general plugins as the
    job's processes do, whoever started it (the launcher, a check tool's ranks, a test). Appended: metadata
    of a really installed vllm still wins."""

    if not dist_dir(root).is_dir():
        return False
    entry = path_entry(root)
    if entry not in sys.path:
        sys.path.append(entry)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if entry not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join(parts + [entry])
    return True


# ---- reading upstream declarations --------------------------------------------------------------
def render_entry_points(groups: dict[str, dict[str, str]]) -> str:
    """entry_points.txt text: groups and names sorted, `name = module:attr` lines (the setuptools format)."""
    out = []
    for group in sorted(groups):
        if not groups[group]:
            continue
        out.append(f"[{group}]")
        out += [f"{name} = {groups[group][name]}" for name in sorted(groups[group])]
        out.append("")
    return "\n".join(out)


def parse_entry_points(text: str, where: str) -> dict[str, dict[str, str]]:
    groups: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = groups.setdefault(line[1:-1].strip(), {})
            continue
        name, sep, value = line.partition("=")
        if current is None or not sep or not name.strip() or not value.strip():
            raise DistInfoError(f"{where}:{n}: not an entry point line: {raw!r}")
        current[name.strip()] = value.strip()
    return groups


def entry_points_from_setup_py(source: bytes, where: str) -> dict[str, dict[str, str]]:
    """The literal `entry_points=` keyword of the `setup(...)` call, without running setup.py."""
    tree = ast.parse(source, filename=where)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "setup":
            for kw in node.keywords:
                if kw.arg == "entry_points":
                    try:
                        value = ast.literal_eval(kw.value)
                    except ValueError:
                        raise DistInfoError(
                            f"{where}: entry_points is not a literal; cannot read it without running setup.py"
                        ) from None
                    return {g: dict(_split_spec(s, where) for s in specs) for g, specs in value.items()}
    return {}


def _split_spec(spec: str, where: str) -> tuple[str, str]:
    name, sep, value = spec.partition("=")
    if not sep:
        raise DistInfoError(f"{where}: entry point {spec!r} has no '='")
    return name.strip(), value.strip()


def entry_points_from_pyproject(source: bytes, where: str) -> dict[str, dict[str, str]]:
    try:
        project = _toml.loads(source.decode("utf-8")).get("project", {})
    except (_toml.TOMLDecodeError, UnicodeDecodeError) as e:
        raise DistInfoError(f"{where}: {e}") from None
    groups = {g: dict(v) for g, v in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        groups.setdefault("console_scripts", {}).update(project["scripts"])
    return groups


def _merge(*parts: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for part in parts:
        for group, items in part.items():
            out.setdefault(group, {}).update(items)
    return out


def _sdist_top(comp: Component) -> str:
    assert comp.pypi is not None
    return comp.pypi.subdir.split("/", 1)[0]


def _from_artifact(comp: Component, artifact: Path) -> tuple[dict[str, dict[str, str]], str]:
    if comp.pypi is None or comp.pypi.is_wheel:
        raise DistInfoError(f"{comp.name}: {artifact.name} is not the pinned sdist")

    member = f"{comp.package}.egg-info/entry_points.txt"
    data = read_member(artifact, _sdist_top(comp), member)
    if data is None:
        raise DistInfoError(f"{comp.name}: {artifact} has no {_sdist_top(comp)}/{member}")
    where = f"{artifact.name}:{_sdist_top(comp)}/{member}"
    return parse_entry_points(data.decode("utf-8"), where), where


def _from_git(comp: Component, git_dir: Path) -> tuple[dict[str, dict[str, str]], str]:
    found: list[dict[str, dict[str, str]]] = []
    for name, reader in (("pyproject.toml", entry_points_from_pyproject), ("setup.py", entry_points_from_setup_py)):
        blob = git_route.read_blob(git_dir, comp.commit, name)
        if blob is not None:
            found.append(reader(blob, f"{comp.name}@{comp.commit[:12]}:{name}"))
    if not found:
        raise DistInfoError(f"{comp.name}: neither pyproject.toml nor setup.py at {comp.commit} in {git_dir}")
    return _merge(*found), f"git {comp.commit}:pyproject.toml+setup.py"


def upstream_entry_points(comp: Component, provenance: dict) -> tuple[dict[str, dict[str, str]], str]:
    """Entry points the pinned upstream declares, from whatever artifact setup used (no network)."""

    route = provenance.get("route")
    artifact = provenance.get("artifact")
    origin = provenance.get("origin_route") or route
    if origin == "pypi" and artifact and Path(artifact).is_file():
        return _from_artifact(comp, Path(artifact))
    if origin == "git":
        git_dir = (
            Path(provenance["git_dir"])
            if provenance.get("git_dir")
            else git_route.cache_git_dir(user_cache_dir(), comp)
        )
        if git_route.has_commit(git_dir, comp.commit):
            return _from_git(comp, git_dir)
    if comp.pypi is not None:  # any route: the sdist may still be in the download cache
        cached = cached_artifact(user_cache_dir(), comp.pypi)
        if cached.is_file():
            return _from_artifact(comp, cached)
    raise DistInfoError(
        f"{comp.name}: no pinned artifact to read its entry points from (route {route or '-'}; "
        f"expected the sdist {comp.pypi.file if comp.pypi else '-'} or the git commit "
        f"{comp.commit[:12]} in the cache); run setup_sources.sh --only {comp.name} --force"
    )


def spec_for(comp: Component, provenance: dict) -> DistSpec:
    if comp.pypi is None:
        raise DistInfoError(f"{comp.name}: the lock names no version for it (no [components.{comp.name}.pypi])")
    groups, source = upstream_entry_points(comp, provenance)
    return DistSpec(
        component=comp.name,
        name=DISTRIBUTIONS[comp.name],
        version=comp.pypi.version,
        top_level=comp.package,
        entry_points=render_entry_points(groups),
        source=source,
    )


# ---- writing ------------------------------------------------------------------------------------
def metadata_files(spec: DistSpec, comp: Component) -> dict[str, str]:
    """The files of one .dist-info folder, as text (RECORD last: it lists the others with hashes)."""
    files = {
        "METADATA": (
            f"Metadata-Version: 2.1\nName: {spec.name}\nVersion: {spec.version}\n"
            f"Summary: {comp.name} {comp.ref} ({comp.commit[:12]}), vendored source tree "
            f"'{comp.package}/' of the verl overlay\n"
        ),
        "entry_points.txt": spec.entry_points,
        "top_level.txt": spec.top_level + "\n",
        "INSTALLER": INSTALLER + "\n",
        PROVENANCE_FILE: json.dumps(
            {"component": comp.name, "commit": comp.commit, "version": spec.version, "entry_points_from": spec.source},
            indent=2,
            sort_keys=True,
        )
        + "\n",
    }
    rows = []
    for name, text in files.items():
        digest = hashlib.sha256(text.encode()).digest()
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        rows.append(f"{spec.folder_name}/{name},sha256={b64},{len(text.encode())}")
    rows.append(f"{spec.folder_name}/RECORD,,")
    files["RECORD"] = "\n".join(rows) + "\n"
    return files


def _folder_matches(folder: Path, files: dict[str, str]) -> bool:
    if not folder.is_dir() or sorted(p.name for p in folder.iterdir()) != sorted(files):
        return False
    return all((folder / n).read_text(encoding="utf-8") == t for n, t in files.items())


def _write_folder(parent: Path, name: str, files: dict[str, str]) -> None:
    """Build beside the target, then rename: a reader sees the old folder or the new one, never half."""
    tmp = temp_dir_for(parent / name)
    try:
        for fname, text in files.items():
            (tmp / fname).write_text(text, encoding="utf-8")
        swap_folder_in(tmp, parent / name, parent / f".{name}.old.{os.getpid()}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass
class DistOutcome:
    component: str
    status: str  # written | unchanged | skipped | failed
    detail: str


def generate(root: Path, lock: Lock, names: list[str] | None = None) -> list[DistOutcome]:
    """Write (or leave as is) the .dist-info folder of every selected component that needs one."""

    state = load_state(root)
    out: list[DistOutcome] = []
    parent = dist_dir(root)
    for comp in lock.select(names):
        if comp.name not in DISTRIBUTIONS:
            continue
        if not (Path(root) / comp.package).is_dir():
            out.append(DistOutcome(comp.name, "skipped", f"{comp.package}/ is not installed"))
            continue
        try:
            spec = spec_for(comp, state.get(comp.name, {}))
        except DistInfoError as e:
            out.append(DistOutcome(comp.name, "failed", str(e)))
            continue
        parent.mkdir(exist_ok=True)
        files = metadata_files(spec, comp)
        for stale in parent.glob(f"{spec.name.replace('-', '_')}-*.dist-info"):
            if stale.name != spec.folder_name:  # an earlier pin's metadata would shadow this one
                shutil.rmtree(stale)
        if _folder_matches(parent / spec.folder_name, files):
            out.append(DistOutcome(comp.name, "unchanged", f"{DIST_DIR_NAME}/{spec.folder_name}"))
            continue
        _write_folder(parent, spec.folder_name, files)
        out.append(
            DistOutcome(comp.name, "written", f"{DIST_DIR_NAME}/{spec.folder_name} (entry points from {spec.source})")
        )
    return out


# ---- verify / audit -----------------------------------------------------------------------------
def report(root: Path, lock: Lock, names: list[str] | None = None) -> list[dict]:
    """Per component: status match | mismatch | missing | unavailable, the folder, entry points, problems.

    `match` means the folder holds exactly what `generate` would write now (entry points re-read from
    the pinned artifact). Without the artifact (cache cleared), the folder is checked against the lock's
    name and version only, and the status says so (`unverified`)."""

    state = load_state(root)
    rows = []
    for comp in lock.select(names):
        if comp.name not in DISTRIBUTIONS or comp.pypi is None:
            continue
        folder = dist_dir(root) / f"{DISTRIBUTIONS[comp.name]}-{comp.pypi.version}.dist-info"
        row = {
            "component": comp.name,
            "distribution": DISTRIBUTIONS[comp.name],
            "version": comp.pypi.version,
            "folder": f"{DIST_DIR_NAME}/{folder.name}",
            "status": "missing",
            "entry_points": {},
            "problems": [],
        }
        rows.append(row)
        if not folder.is_dir():
            row["problems"].append(f"{row['folder']} is missing: run setup_sources.sh (it generates it)")
            continue
        text = (
            (folder / "entry_points.txt").read_text(encoding="utf-8") if (folder / "entry_points.txt").is_file() else ""
        )
        row["entry_points"] = parse_entry_points(text, f"{row['folder']}/entry_points.txt")
        try:
            spec = spec_for(comp, state.get(comp.name, {}))
        except DistInfoError as e:
            meta = (folder / "METADATA").read_text(encoding="utf-8") if (folder / "METADATA").is_file() else ""
            ok = f"Name: {row['distribution']}\n" in meta and f"Version: {row['version']}\n" in meta
            row["status"] = "unverified" if ok else "mismatch"
            row["problems"].append(f"entry points not re-checked: {e}")
            continue
        if _folder_matches(folder, metadata_files(spec, comp)):
            row["status"] = "match"
        else:
            row["status"] = "mismatch"
            row["problems"].append(
                f"{row['folder']} differs from what the pin declares ({spec.source}); "
                f"run setup_sources.sh to regenerate it"
            )
    return rows


def render(rows: list[dict]) -> str:
    lines = []
    for r in rows:
        eps = "; ".join(
            f"{g}: {', '.join(sorted(v))}" for g, v in sorted(r["entry_points"].items()) if g != "console_scripts"
        )
        lines.append(f"{r['distribution']:<14} {r['status'].upper():<10} {r['folder']}  {eps}")
        lines += [f"    {p}" for p in r["problems"]]
    return "\n".join(lines)


def exit_status(rows: list[dict]) -> int:
    return 1 if any(r["status"] in ("missing", "mismatch") for r in rows) else 0
