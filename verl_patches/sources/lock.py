"""The lock file model: what each upstream component is, where it comes from, and what it must hash to."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_text_atomically
from verl_patches.sources import names

try:  # Python 3.11+
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10: setup_sources.sh bootstraps tomli into the user cache
    import tomli as _toml  # type: ignore[no-redef]

ROUTES = ("git", "pypi", "cache")
HEX40 = re.compile(r"^[0-9a-f]{40}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")


class LockError(ValueError):
    """The lock file is malformed; the message names the file and the key at fault."""


@dataclass(frozen=True)
class PypiArtifact:
    name: str
    version: str
    file: str
    sha256: str
    subdir: str  # folder inside the archive that becomes the package folder
    url: str = ""  # direct download address, used when the index lookup fails

    @property
    def is_wheel(self) -> bool:
        return self.file.endswith(".whl")


@dataclass(frozen=True)
class Component:
    name: str
    package: str  # folder at the repo root
    git_urls: tuple[str, ...]
    ref: str
    commit: str
    git_subdir: str
    needed_on: tuple[str, ...]  # devices whose jobs import it: "npu", "cpu"
    pypi: PypiArtifact | None
    tree_sha256: dict[str, str] = field(default_factory=dict)  # route -> expected tree hash
    notes: str = ""
    # device -> subfolders of the package folder that jobs on that device import. A route whose tree lacks
    # one (megatron-core's wheel holds megatron/core only; MindSpeed-LLM on A3 imports megatron/training)
    # matches its own tree hash and still cannot run the job: `required_parts` refuses it by name.
    subfolders_needed_on: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def expected_hashes(self) -> dict[str, str]:
        return {route: h for route, h in self.tree_sha256.items() if h}


@dataclass(frozen=True)
class Lock:
    path: Path
    components: dict[str, Component]
    prelude_file: str
    prelude_line: str

    def select(self, names: list[str] | None) -> list[Component]:
        if not names:
            return list(self.components.values())
        unknown = [n for n in names if n not in self.components]
        if unknown:
            raise LockError(
                f"{self.path}: unknown component(s) {', '.join(unknown)}; known: {', '.join(self.components)}"
            )
        return [self.components[n] for n in names]


def _req(table: dict[str, Any], key: str, where: str, typ: type) -> Any:
    if key not in table:
        raise LockError(f"{where}: missing key '{key}'")
    value = table[key]
    if not isinstance(value, typ):
        raise LockError(f"{where}.{key}: expected {typ.__name__}, got {type(value).__name__}")
    return value


def _checked(check: Callable[[object], str], value: object, where: str) -> Any:
    """`value` if the allow-list `check` accepts it, else a LockError naming the key."""
    try:
        return check(value)
    except ValueError as e:
        raise LockError(f"{where}: {e}") from None


def _parse_component(name: str, table: dict[str, Any], where: str) -> Component:
    # The name becomes a cache folder and an environment variable name, the package a folder at the
    # root, the subdirs archive prefixes: each is allow-listed so none can leave its folder.
    _checked(names.plain_name, name, where)
    if not isinstance(table, dict):
        raise LockError(f"{where}: expected a table, got {type(table).__name__}")
    commit = _req(table, "commit", where, str)
    if not HEX40.match(commit):
        raise LockError(f"{where}.commit: '{commit}' is not a full 40-hex commit id")
    urls = _req(table, "git_urls", where, list)
    if not urls or not all(isinstance(u, str) and u for u in urls):
        raise LockError(f"{where}.git_urls: needs at least one URL string")
    for i, u in enumerate(urls):
        _checked(names.git_url, u, f"{where}.git_urls[{i}]")
    pypi = None
    if "pypi" in table:
        p = table["pypi"]
        pw = f"{where}.pypi"
        if not isinstance(p, dict):
            raise LockError(f"{pw}: expected a table, got {type(p).__name__}")
        sha = _req(p, "sha256", pw, str)
        if not HEX64.match(sha):
            raise LockError(f"{pw}.sha256: '{sha}' is not a 64-hex sha256")
        url = p.get("url", "")
        if url:
            _checked(names.download_url, url, f"{pw}.url")
        pypi = PypiArtifact(
            name=_checked(names.plain_name, _req(p, "name", pw, str), f"{pw}.name"),
            version=_req(p, "version", pw, str),
            file=_checked(names.artifact_file, _req(p, "file", pw, str), f"{pw}.file"),
            sha256=sha,
            subdir=_checked(names.relative_path, _req(p, "subdir", pw, str), f"{pw}.subdir"),
            url=url,
        )
    hashes = table.get("tree_sha256", {})
    if not isinstance(hashes, dict):
        raise LockError(f"{where}.tree_sha256: expected a table, got {type(hashes).__name__}")
    for route, h in hashes.items():
        if route not in ("git", "pypi"):
            raise LockError(f"{where}.tree_sha256.{route}: unknown route (expected git or pypi)")
        if not isinstance(h, str) or (h and not HEX64.match(h)):
            raise LockError(f"{where}.tree_sha256.{route}: '{h}' is not a 64-hex sha256")
    if pypi is None and hashes.get("pypi"):
        raise LockError(f"{where}.tree_sha256.pypi: set, but the component has no [pypi] artifact")
    needed_raw = table.get("needed_on", ["npu", "cpu"])
    if not isinstance(needed_raw, list):
        raise LockError(f"{where}.needed_on: expected a list of devices, got {type(needed_raw).__name__}")
    needed = tuple(needed_raw)
    for d in needed:
        if d not in ("npu", "cuda", "cpu"):
            raise LockError(f"{where}.needed_on: unknown device '{d}'")
    subfolders = _subfolders_needed_on(table.get("subfolders_needed_on", {}), f"{where}.subfolders_needed_on")
    return Component(
        name=name,
        package=_checked(names.package_folder, _req(table, "package", where, str), f"{where}.package"),
        git_urls=tuple(urls),
        ref=_checked(names.git_ref, _req(table, "ref", where, str), f"{where}.ref"),
        commit=commit,
        git_subdir=_checked(names.relative_path, _req(table, "git_subdir", where, str), f"{where}.git_subdir"),
        needed_on=needed,
        pypi=pypi,
        tree_sha256=dict(hashes),
        notes=table.get("notes", ""),
        subfolders_needed_on=subfolders,
    )


def _subfolders_needed_on(raw: object, where: str) -> dict[str, tuple[str, ...]]:
    """``{device: [relative folder, ...]}``: each device one the lock knows, each folder confined to the package."""
    if not isinstance(raw, dict):
        raise LockError(f"{where}: expected a table of device = [folders], got {type(raw).__name__}")
    out: dict[str, tuple[str, ...]] = {}
    for device, folders in raw.items():
        if device not in ("npu", "cuda", "cpu"):
            raise LockError(f"{where}.{device}: unknown device (expected npu, cuda or cpu)")
        if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
            raise LockError(f"{where}.{device}: expected a list of folder names")
        out[device] = tuple(_checked(names.relative_path, f, f"{where}.{device}") for f in folders)
    return out


def load_lock(path: Path) -> Lock:
    path = Path(path)
    try:
        data = _toml.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LockError(f"{path}: lock file not found") from None
    except _toml.TOMLDecodeError as e:
        raise LockError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise LockError(f"{path}: nested too deeply to be a lock file") from None
    except UnicodeDecodeError as e:
        raise LockError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if data.get("schema") != 1:
        raise LockError(f"{path}: key 'schema' must be 1 (found {data.get('schema')!r})")
    comps = data.get("components")
    if not isinstance(comps, dict) or not comps:
        raise LockError(f"{path}: no [components.*] tables")
    parsed = {n: _parse_component(n, t, f"{path.name}: components.{n}") for n, t in comps.items()}
    packages = [c.package for c in parsed.values()]
    if len(set(packages)) != len(packages):
        raise LockError(f"{path}: two components share a package folder: {packages}")
    prelude = data.get("prelude", {})
    if not isinstance(prelude, dict):
        raise LockError(f"{path.name}: prelude: expected a table")
    return Lock(
        path=path,
        components=parsed,
        prelude_file=_checked(
            names.relative_path, _req(prelude, "file", f"{path.name}: prelude", str), f"{path.name}: prelude.file"
        ),
        prelude_line=_req(prelude, "line", f"{path.name}: prelude", str),
    )


def rewrite_tree_hash(path: Path, component: str, route: str, new_hash: str) -> bool:
    """Set components.<component>.tree_sha256.<route> in the lock text, keeping comments and layout.

    Returns True if the file changed. Written to a temp file, then renamed.
    """
    text = path.read_text(encoding="utf-8")
    header = re.compile(rf"^\[components\.{re.escape(component)}\.tree_sha256\]\s*$", re.M)
    m = header.search(text)
    if not m:
        raise LockError(f"{path}: no [components.{component}.tree_sha256] table to update")
    nxt = re.compile(r"^\[", re.M).search(text, m.end())
    end = nxt.start() if nxt else len(text)
    body = text[m.end() : end]
    line = re.compile(rf'^{route}\s*=\s*"[0-9a-f]*".*$', re.M)
    new_line = f'{route} = "{new_hash}"'
    if line.search(body):
        body2 = line.sub(new_line, body, count=1)
    else:
        body2 = body.rstrip("\n") + f"\n{new_line}\n" + ("\n" if nxt else "")
    if body2 == body:
        return False
    write_text_atomically(path, text[: m.end()] + body2 + text[end:])
    return True
