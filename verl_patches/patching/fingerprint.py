"""Fingerprints of upstream source, computed from the file without importing it.

A fingerprint is the sha256 of the AST of the definition (function, class, or module-level
assignment) named by a qualified name: formatting and comments do not change it, code does. Because
it reads the file, the same value comes out at runtime (from the imported module's __file__), in the
audit (from the vendored tree, nothing imported), and on hosts where the module cannot import.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import sys
from functools import lru_cache
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.atomic_write import write_text_atomically

PREFIX = "sha256:"
# Parsing a large upstream file (transformers' modeling_utils is 300 kB) costs tens of ms, and far more
# when it triggers a full garbage collection in a process that has torch loaded: fingerprints are
# cached on disk, keyed by the sha256 of the file contents (so an edited file is always re-checked).
CACHE_ENV = "VERL_PATCHES_FINGERPRINT_CACHE"  # cache directory, or "off"
_CACHE_FORMAT = "3"  # 3: imports, tuple targets and branch conditions are part of a definition


class FingerprintError(LookupError):
    pass


def module_file(module: str, root: Path | None = None) -> Path | None:
    """The source file of a module without importing it: under `root` first, else where Python finds it."""
    parts = module.split(".")
    bases = [Path(root)] if root else []
    if not root:
        bases += [Path(p) for p in sys.path if p and Path(p).is_dir()]
        loaded_file = getattr(sys.modules.get(module), "__file__", None)
        if loaded_file:
            return Path(loaded_file)
    for base in bases:
        for cand in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
            if cand.is_file():
                return cand
    if root is None:
        try:
            spec = importlib.util.find_spec(parts[0])
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return Path(spec.origin) if spec and spec.origin and len(parts) == 1 else None
        for loc in spec.submodule_search_locations:
            sub = Path(loc).joinpath(*parts[1:])
            for cand in (sub.with_suffix(".py"), sub / "__init__.py"):
                if cand.is_file():
                    return cand
    return None


@lru_cache(maxsize=64)
def _parse_source(source: bytes, filename: str) -> ast.Module:
    return ast.parse(source, filename=filename)


def _parse(path: Path) -> ast.Module:
    # Keyed by content, not mtime: a file rewritten within one mtime tick must not reuse the old tree
    # (its fingerprint is cached on disk under the new content's key).
    return _parse_source(path.read_bytes(), str(path))


def _target_names(target: ast.expr) -> set[str]:
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_target_names(t) for t in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _target_names(target.value)
    return set()


def _assigned_names(node: ast.stmt) -> set[str]:
    """Names a simple statement binds at its level: assignments (also `f, g = ...`) and imports."""
    if isinstance(node, ast.Assign):
        return set().union(*(_target_names(t) for t in node.targets))
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return _target_names(node.target)
    if isinstance(node, ast.Import):  # `import a.b` binds `a`; `import a.b as c` binds `c`
        return {a.asname or a.name.split(".")[0] for a in node.names}
    if isinstance(node, ast.ImportFrom):
        return {a.asname or a.name for a in node.names}
    return set()


# Blocks of compound statements whose bodies run at the enclosing level, and the parts of the statement
# that decide which block runs (its "guard"): a definition in one branch is only the code that runs if
# the condition still selects it, so the condition is part of the fingerprint.
_BLOCKS: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {
    ast.If: (("body", "orelse"), ("test",)),
    ast.While: (("body", "orelse"), ("test",)),
    ast.For: (("body", "orelse"), ("target", "iter")),
    ast.AsyncFor: (("body", "orelse"), ("target", "iter")),
    ast.With: (("body",), ("items",)),
    ast.AsyncWith: (("body",), ("items",)),
    ast.Try: (("body", "orelse", "finalbody"), ()),
}
if hasattr(ast, "TryStar"):  # Python 3.11+
    _BLOCKS[ast.TryStar] = (("body", "orelse", "finalbody"), ())


def _nested_defs(node: ast.stmt, name: str) -> list[ast.AST]:
    """Definitions of `name` inside a compound statement, preceded by what selects them."""
    found: list[ast.AST] = []
    guards: list[ast.expr | list[ast.withitem]] = []  # a block's test or iterable, or a with's items
    kind = _BLOCKS.get(type(node))
    if kind is not None:
        blocks, guard_fields = kind
        for block in blocks:
            found += _defs_in(getattr(node, block, []), name)
        guards = [getattr(node, f) for f in guard_fields if getattr(node, f, None) is not None]
        if isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            handlers: list[ast.ExceptHandler] = node.handlers  # type: ignore[attr-defined]  # ast.TryStar: 3.11+
            for h in handlers:
                sub = _defs_in(h.body, name)
                if sub:
                    found += ([h.type] if h.type is not None else []) + sub
    elif isinstance(node, ast.Match):
        for case in node.cases:
            sub = _defs_in(case.body, name)
            if sub:
                found += [case.pattern] + ([case.guard] if case.guard is not None else []) + sub
        guards = [node.subject]
    if not found:
        return []
    # the guard is a list of expressions (or withitems); wrapped so canonical() sees one node per guard
    return [
        ast.Expr(value=g)
        if isinstance(g, ast.expr)
        else ast.Expr(value=ast.Tuple(elts=[i.context_expr for i in g], ctx=ast.Load()))
        for g in guards
    ] + found


def _defs_in(body: list[ast.stmt], name: str) -> list[ast.AST]:
    """Every definition of `name` at this level, including inside if/try/with/for/while/match blocks
    (all may run), with the conditions that choose among them."""
    found: list[ast.AST] = []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            found.append(node)
        elif name in _assigned_names(node):
            found.append(node)
        elif isinstance(node, (ast.For, ast.AsyncFor)) and name in _target_names(node.target):
            found.append(node)  # the loop variable is the definition; the whole loop decides its value
        else:
            found += _nested_defs(node, name)
    return found


def source_nodes(path: Path, qualname: str) -> list[ast.AST]:
    tree = _parse(path)
    scopes: list[ast.AST] = [tree]
    outer: list[ast.AST] = []  # conditions (and bindings) met on the way down: they select the scopes
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        nxt: list[ast.AST] = []
        for scope in scopes:
            nxt += _defs_in(getattr(scope, "body", []), part)
        if not nxt:
            raise FingerprintError(f"{path}: no definition of {qualname!r} (missing part {part!r})")
        if i < len(parts) - 1:
            outer += [n for n in nxt if not isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
            nxt = [n for n in nxt if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
        scopes = nxt
    return outer + scopes


def canonical(node: object) -> str:
    """The code of an AST as text, stable across Python 3.10-3.12 for code that parses on all of them.

    `ast.dump` lists every field, including ones later versions added with empty defaults (3.12's
    `type_params=[]`), so a cluster on another Python minor would see every fingerprint drift. Empty
    fields are left out here; anything present is kept, so a real code change still shows.
    """
    if isinstance(node, ast.AST):
        parts = []
        for name in node._fields:
            value = getattr(node, name, None)
            if value is None or value == []:
                continue
            parts.append(f"{name}={canonical(value)}")
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(canonical(v) for v in node) + "]"
    return repr(node)


def fingerprint_nodes(nodes: list[ast.AST]) -> str:
    h = hashlib.sha256()
    for n in nodes:
        h.update(canonical(n).encode())
    return PREFIX + h.hexdigest()[:16]


def target_nodes(target: str, root: Path | None = None) -> list[ast.AST]:
    module, _, qualname = target.partition(":")
    path = module_file(module, root)
    if path is None:
        raise FingerprintError(f"no source file for module {module!r}" + (f" under {root}" if root else ""))
    if not qualname:
        return [_parse(path)]
    return source_nodes(path, qualname)


def _cache_dir() -> Path | None:
    raw = env_registry.text(CACHE_ENV)  # a folder, or "off"
    if raw.lower() == "off":
        return None
    if raw:
        return Path(raw)
    return Path(env_registry.text("XDG_CACHE_HOME") or Path.home() / ".cache") / "verl_patches" / "fingerprints"


def _cache_key(targets: tuple[str, ...], root: Path | None) -> str | None:
    # ast.dump's output depends on the Python minor version, so the version is part of the key.
    h = hashlib.sha256(f"{_CACHE_FORMAT}|{sys.version_info[0]}.{sys.version_info[1]}".encode())
    for t in targets:
        module, _, qualname = t.partition(":")
        path = module_file(module, root)
        if path is None:
            return None
        h.update(f"|{qualname}|".encode() + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _store(path: Path, value: str) -> None:
    try:
        write_text_atomically(path, value)
    except OSError:
        pass  # a read-only home only costs the parse next time


def fingerprint_target(*targets: str, root: Path | None = None) -> str:
    """Fingerprint of one or more "module:qualname" targets (a bare module name: the whole module)."""
    cache, key = _cache_dir(), None
    if cache is not None:
        try:
            key = _cache_key(targets, root)
            if key is not None:
                cached = (cache / key).read_text().strip()
                if cached.startswith(PREFIX):
                    return cached
        except OSError:
            pass
    nodes: list[ast.AST] = []
    for t in targets:
        nodes += target_nodes(t, root)
    found = fingerprint_nodes(nodes)
    if cache is not None and key is not None:
        _store(cache / key, found)
    return found


def main(argv: list[str] | None = None) -> int:
    """`python -m verl_patches.patching.fingerprint module:qualname ...`: print pinned fingerprints."""

    p = argparse.ArgumentParser(
        description="Fingerprint upstream definitions in the vendored trees "
        "(what a Patch declaration's `fingerprint` must say)."
    )
    p.add_argument("targets", nargs="+", metavar="module:qualname")
    p.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    args = p.parse_args(argv)
    try:
        for t in args.targets:
            print(f"{fingerprint_target(t, root=args.root)}  {t}")
        if len(args.targets) > 1:
            print(f"{fingerprint_target(*args.targets, root=args.root)}  (all together)")
    except (FingerprintError, SyntaxError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
