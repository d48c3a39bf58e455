"""Verify and audit: how each package folder compares with the lock, and the exact diff from pristine.

Needs no network: pristine content comes from the artifacts setup left in the cache, or, for a folder
whose tree hash matches the lock, from stripping our one inserted line.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path

from verl_patches.sources import git_route, prelude_line, pypi_route
from verl_patches.sources.extract import read_member
from verl_patches.sources.folder_check import FolderReport, check_folder, prelude_relpath
from verl_patches.sources.lock import Component, Lock
from verl_patches.sources.paths import user_cache_dir
from verl_patches.sources.required_parts import describe_missing, missing_subfolders
from verl_patches.sources.state import load_state

AUDIT_SCHEMA = "verl-overlay-audit/1"


def _pristine_bytes(
    lock: Lock, comp: Component, prov: dict, rel: str, current: bytes | None, rep: FolderReport
) -> bytes | None:
    if rep.pristine and rel == prelude_relpath(lock, comp) and current is not None:
        return prelude_line.strip(current, lock.prelude_line)
    route = prov.get("route")
    try:
        if route == "git" and prov.get("git_dir"):
            return git_route.read_blob(Path(prov["git_dir"]), prov["commit"], f"{prov['subdir']}/{rel}")
        if route in ("pypi", "cache") and prov.get("artifact") and Path(prov["artifact"]).exists():
            return read_member(Path(prov["artifact"]), prov["subdir"], rel)
        return _pristine_from_download_cache(comp, prov.get("origin_route") or rep.compared_route, rel)
    except Exception:  # an unreadable cache only costs the diff text, reported below
        return None


def _pristine_from_download_cache(comp: Component, origin: str | None, rel: str) -> bytes | None:
    """The pristine file from the user download cache, for folders whose state records no artifact
    (set up before provenance was kept, or with the state file lost)."""
    cache = user_cache_dir()
    if origin == "pypi" and comp.pypi is not None:
        artifact = pypi_route.cached_artifact(cache, comp.pypi)
        if artifact.exists() and _sha256_cached(str(artifact), artifact.stat().st_mtime_ns) == comp.pypi.sha256:
            return read_member(artifact, comp.pypi.subdir, rel)
    if origin == "git":
        git_dir = git_route.cache_git_dir(cache, comp)
        if git_route.has_commit(git_dir, comp.commit):
            return git_route.read_blob(git_dir, comp.commit, f"{comp.git_subdir}/{rel}")
    return None


@functools.lru_cache(maxsize=16)
def _sha256_cached(path: str, mtime_ns: int) -> str:
    return pypi_route.sha256_file(Path(path))


def _udiff(pkg: str, rel: str, old: bytes | None, new: bytes | None) -> str:
    a = old.decode("utf-8", errors="replace").splitlines(keepends=True) if old is not None else []
    b = new.decode("utf-8", errors="replace").splitlines(keepends=True) if new is not None else []
    return "".join(
        difflib.unified_diff(
            a,
            b,
            f"a/{pkg}/{rel}" if old is not None else "/dev/null",
            f"b/{pkg}/{rel}" if new is not None else "/dev/null",
        )
    )


def component_report(root: Path, lock: Lock, comp: Component, state: dict, device: str, with_diff: bool = True) -> dict:
    prov = state.get(comp.name, {})
    rep = check_folder(root, lock, comp, prov.get("origin_route"))
    status = "missing" if not rep.exists else ("match" if rep.ok else "mismatch")
    problems = []
    if rep.exists and not rep.pristine:
        problems += rep.difference_lines(limit=10**6) or [f"tree hash {rep.tree_sha256} matches no route"]
    lacking = missing_subfolders(comp, Path(root) / comp.package, [device]) if rep.exists else {}
    if lacking:  # exactly what its route pins, and still not what this host's jobs import
        problems.append(describe_missing(comp, lacking))
        if status == "match":
            status = "incomplete"
    if rep.exists and rep.prelude_expected and not rep.prelude_in_place:
        problems.append(f"prelude line missing or misplaced in {lock.prelude_file}: '{lock.prelude_line}'")
    out = {
        "name": comp.name,
        "package": comp.package,
        "ref": comp.ref,
        "commit": comp.commit,
        "pypi_file": comp.pypi.file if comp.pypi else None,
        "needed_on": list(comp.needed_on),
        "optional_here": device not in comp.needed_on,
        "route": prov.get("route"),
        "origin_route": rep.matched_route or prov.get("origin_route"),
        "status": status,
        "expected_tree_sha256": comp.expected_hashes(),
        "found_tree_sha256": rep.tree_sha256 or None,
        "differences": rep.differences,
        "problems": problems,
        "prelude": {"file": lock.prelude_file, "expected": rep.prelude_expected, "in_place": rep.prelude_in_place}
        if rep.prelude_expected
        else None,
        "diff": "",
        "diff_unavailable": [],
    }
    if with_diff and rep.exists:
        folder = Path(root) / comp.package
        rels = sorted(
            set(rep.differences.get("changed", []))
            | set(rep.differences.get("added", []))
            | set(rep.differences.get("removed", []))
        )
        pre = prelude_relpath(lock, comp)
        if pre and pre not in rels and (folder / pre).exists():
            rels.insert(0, pre)
        chunks = []
        for rel in rels:
            path = folder / rel
            current = path.read_bytes() if path.is_file() else None
            pristine = (
                None
                if rel in rep.differences.get("added", [])
                else _pristine_bytes(lock, comp, prov, rel, current, rep)
            )
            if pristine is None and rel not in rep.differences.get("added", []):
                out["diff_unavailable"].append(rel)
                continue
            chunks.append(_udiff(comp.package, rel, pristine, current))
        out["diff"] = "".join(chunks)
    return out


def sources_report(root: Path, lock: Lock, device: str, names: list[str] | None = None, with_diff: bool = True) -> dict:
    state = load_state(root)
    comps = [component_report(root, lock, c, state, device, with_diff) for c in lock.select(names)]
    return {"lock": str(lock.path), "device": device, "components": comps}


def exit_status(components: list[dict]) -> int:
    """0: everything matches; 3: everything this host needs matches, optional-here parts missing; 1: else."""
    bad = [c for c in components if c["status"] != "match" and not (c["status"] == "missing" and c["optional_here"])]
    if bad:
        return 1
    return 3 if any(c["status"] == "missing" for c in components) else 0


def render_verify(components: list[dict]) -> str:
    lines = []
    for c in components:
        tag = {"match": "OK", "mismatch": "MISMATCH", "missing": "MISSING", "incomplete": "INCOMPLETE"}[c["status"]]
        if c["status"] == "missing" and c["optional_here"]:
            tag = "MISSING (optional on this host)"
        lines.append(f"{c['name']:<14} {tag:<32} {c['ref']} @ {c['commit'][:12]}  route={c['route'] or '-'}")
        lines += [f"    {p}" for p in c["problems"]]
    return "\n".join(lines)
