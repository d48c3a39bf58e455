"""Compare a package folder on disk with what the lock pins, ignoring only our one prelude line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from verl_patches.sources import prelude_line
from verl_patches.sources.bytecode import bytecode_problems
from verl_patches.sources.lock import Component, Lock
from verl_patches.sources.manifests import load_manifest
from verl_patches.sources.treehash import FileHashes, combine, compare, file_hashes


def prelude_relpath(lock: Lock, component: Component) -> str | None:
    """Path of the prelude file inside this component's folder, or None if it is not this component's."""
    prefix = component.package.rstrip("/") + "/"
    return lock.prelude_file[len(prefix) :] if lock.prelude_file.startswith(prefix) else None


def pristine_filters(lock: Lock, component: Component) -> dict:
    rel = prelude_relpath(lock, component)
    return {rel: lambda data: prelude_line.strip(data, lock.prelude_line)} if rel else {}


@dataclass
class FolderReport:
    component: str
    exists: bool
    tree_sha256: str = ""
    matched_route: str | None = None  # the route whose pinned tree this folder equals, if any
    differences: dict[str, list[str]] = field(default_factory=dict)  # vs the closest route's manifest
    bytecode: list[str] = field(default_factory=list)  # byte-code not proved equal to its source
    compared_route: str | None = None
    prelude_expected: bool = False
    prelude_in_place: bool = False
    records: FileHashes = field(default_factory=dict)

    @property
    def pristine(self) -> bool:
        # byte-code that may run instead of its source makes the folder differ from the lock, although
        # the tree hash (which leaves __pycache__ out) matches
        return self.matched_route is not None and not self.bytecode

    @property
    def ok(self) -> bool:
        return self.exists and self.pristine and (self.prelude_in_place or not self.prelude_expected)

    def difference_lines(self, limit: int = 20) -> list[str]:
        out = []
        for kind in ("changed", "added", "removed"):
            for p in self.differences.get(kind, []):
                out.append(f"{kind}: {self.component}/{p}")
        out += [f"byte-code: {self.component}/{p}" for p in self.bytecode]
        if len(out) > limit:
            out = out[:limit] + [f"… and {len(out) - limit} more"]
        return out


def check_folder(root: Path, lock: Lock, component: Component, preferred_route: str | None = None) -> FolderReport:
    folder = Path(root) / component.package
    rel = prelude_relpath(lock, component)
    rep = FolderReport(component.name, folder.is_dir(), prelude_expected=rel is not None)
    if not rep.exists:
        return rep
    rep.records = file_hashes(folder, pristine_filters(lock, component))
    rep.tree_sha256 = combine(rep.records)
    for route, expected in component.expected_hashes().items():
        if expected == rep.tree_sha256:
            rep.matched_route = route
    rep.bytecode = bytecode_problems(folder)
    if rel is not None:
        target = folder / rel
        rep.prelude_in_place = target.is_file() and prelude_line.is_in_place(
            target.read_bytes(), lock.prelude_line, str(target)
        )
    if rep.matched_route is None:
        best = None
        routes = [preferred_route] if preferred_route else []
        routes += [r for r in ("pypi", "git") if r not in routes]
        for route in routes:
            manifest = load_manifest(lock.path, component.name, route) if route else None
            if manifest is None:
                continue
            diff = compare(manifest, rep.records)
            size = sum(len(v) for v in diff.values())
            if best is None or size < best[0]:
                best = (size, route, diff)
        if best:
            _, rep.compared_route, rep.differences = best
    return rep
