"""Every environment variable verl_patches reads is in `verl_patches.base.env_registry` (issue 43 item 5, issue 41
item 5), and the typed ones are read through it, so the dry run parses a value with the parser, default and bounds
the job uses.

An AST scan of verl_patches/ (its scripts and the emulated torch_npu included) finds every read of the environment:

* ``os.environ[N]``, ``os.environ.get(N)``, ``.pop(N)``, ``os.getenv(N)``, ``N in os.environ``, and the same on a
  mapping that holds the environment (a parameter named ``environ``, or a name bound to ``os.environ``,
  ``environ`` or a ``dict()`` copy of them);
* the getters of `base.env_flags` (``env_flag``, ``env_int``, ...) and of the registry (``flag``, ``integer``, ...);
* a declared switch: a patch's ``env_flag="N"``, a CPU-proof exception's ``env="N"``.

``N`` is resolved when it is a literal, a module-level constant (followed through ``from verl_patches... import``),
or the variable of a loop over a tuple of them. The rules:

1. every resolved name is registered (a family entry such as ``VERL_OVERLAY_GIT_MIRROR_<NAME>`` covers its prefix);
2. a registered variable that is parsed (switch, integer, number, list, choice) is read through the registry's
   getter of its kind, never straight from ``os.environ`` (a presence test, ``if environ.get(N):``, is fine), nor
   with a getter of another kind;
3. no code outside ``verl_patches/base`` calls the `base.env_flags` getters: their defaults and bounds would be a
   second copy of the registry's;
4. a read whose name cannot be resolved is listed in `ALLOWED` with its reason (the registry's getters check the
   name when they run, so they need no entry);
5. every entry of the registry names owners that exist and mention it (a stale entry fails), and the shell scripts'
   variables are registered too.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

import docs_text
from ast_scan import dotted, is_environ
from verl_patches.base import env_registry
from verl_patches.base.env_registry import FAMILY_MARK, REGISTRY, lookup

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "verl_patches"
ENV_FLAGS_GETTERS = {"env_flag", "env_int", "env_float", "env_list", "env_str"}
# the registry's getters -> the kinds each may read (`read` and `variable` take any)
REGISTRY_GETTERS = {
    "flag": {env_registry.FLAG},
    "integer": {env_registry.INT},
    "number": {env_registry.FLOAT},
    "text": {env_registry.TEXT, env_registry.CHOICE, env_registry.RETIRED},
    "items": {env_registry.LIST},
    "read": None,
    "variable": None,
    "is_set": None,
}
# calls whose keyword names a variable that code elsewhere reads by that name: callee -> keyword
DECLARING_KEYWORDS = {"Patch": "env_flag", "CpuProofException": "env"}
ENVIRON_NAMES = {"environ"}  # a parameter by this name is the environment, by the house convention
MACHINERY = {"verl_patches/base/env_flags.py", "verl_patches/base/env_registry.py"}  # the getters themselves

# (path, line text stripped) of a read whose name the scan cannot resolve -> why it is fine
ALLOWED: dict[tuple[str, str], str] = {
    ("verl_patches/launch/settings.py", "elif environ.get(s.name):"): (
        "the cluster settings (settings.SETTINGS, each with its help and check): a table of their own, "
        "which the A3 guide's section 4 and --help list"
    ),
    ("verl_patches/launch/settings.py", "values[s.name], origin[s.name] = environ[s.name], \"environment\""): (
        "the cluster settings, as above"
    ),
    ("verl_patches/launch/preflight/vendor_env.py", "value = env_int(v.name, 0, environ={v.name: v.value})"): (
        "parses a value handed in (the vendor's variable as the job would see it), not this process's environment"
    ),
    ("verl_patches/launch/preflight/report.py", "old = {k: os.environ.get(k) for k in values}"): (
        "saves the path settings the config reads, to restore them after composing it"
    ),
    ("verl_patches/launch/preflight/report.py", "os.environ.pop(k, None)"): "restores them",
}


@dataclass(frozen=True)
class Read:
    path: str
    line: int
    text: str  # the source line, stripped
    how: str  # "environ", "env_flags.<getter>", "registry.<getter>", "declares"
    names: frozenset[str] | None  # None: not resolved
    presence: bool  # only tested for being set (a truth value, ``in``) or shown in a message


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _literal_strings(node: ast.AST) -> set[str] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Dict):  # a table keyed by variable names: its keys
        return _literal_strings(ast.Tuple(elts=[k for k in node.keys if k is not None]))
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out: set[str] = set()
        for elt in node.elts:
            got = _literal_strings(elt)
            if got is None:
                return None
            out |= got
        return out
    return None


def _module_constants(tree: ast.Module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        strings = _literal_strings(value)
        if strings is None and isinstance(value, ast.Call) and dotted(value.func) in ("frozenset", "set", "tuple"):
            strings = _literal_strings(value.args[0]) if len(value.args) == 1 else None
        for t in targets:
            if isinstance(t, ast.Name) and strings is not None:
                out[t.id] = strings
    return out


class _Trees:
    """Every module of verl_patches parsed once, with its module-level string constants."""

    def __init__(self) -> None:
        self.trees = {p: ast.parse(p.read_text(), str(p)) for p in _sources()}
        self.by_module = {_module_name(p): p for p in self.trees}
        self.constants = {p: _module_constants(t) for p, t in self.trees.items()}

    def constant(self, module: str, name: str, seen: frozenset[str] = frozenset()) -> set[str] | None:
        path = self.by_module.get(module)
        if path is None or (module, name) in seen:
            return None
        if name in self.constants[path]:
            return self.constants[path][name]
        for node in self.trees[path].body:  # re-exported: from x import NAME
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self.constant(node.module, alias.name, seen | {(module, name)})
        return None


class _Scanner(ast.NodeVisitor):
    def __init__(self, trees: _Trees, path: Path) -> None:
        self.trees, self.path = trees, path
        self.rel = str(path.relative_to(REPO))
        self.lines = path.read_text().splitlines()
        self.imported: dict[str, tuple[str, str]] = {}  # local name -> (module, name)
        self.modules: dict[str, str] = {}  # local name -> verl_patches module
        self.environs: list[set[str]] = [set(ENVIRON_NAMES)]
        self.loop_names: list[dict[str, set[str]]] = [{}]
        self.tests: set[int] = set()  # ids of nodes in a truth-value position
        self.reads: list[Read] = []

    # names -------------------------------------------------------------------------------------------------
    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0 and node.module.startswith("verl_patches"):
            for alias in node.names:
                local = alias.asname or alias.name
                if f"{node.module}.{alias.name}" in self.trees.by_module:
                    self.modules[local] = f"{node.module}.{alias.name}"
                else:
                    self.imported[local] = (node.module, alias.name)
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname and alias.name in self.trees.by_module:
                self.modules[alias.asname] = alias.name
        self.generic_visit(node)

    def resolve(self, node: ast.AST) -> set[str] | None:
        got = _literal_strings(node)
        if got is not None:
            return got
        if isinstance(node, ast.Name):
            for scope in reversed(self.loop_names):
                if node.id in scope:
                    return scope[node.id]
            if node.id in self.trees.constants[self.path]:
                return self.trees.constants[self.path][node.id]
            if node.id in self.imported:
                return self.trees.constant(*self.imported[node.id])
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules:
            return self.trees.constant(self.modules[node.value.id], node.attr)
        if isinstance(node, ast.Call) and dotted(node.func) in ("set", "frozenset", "tuple") and len(node.args) == 1:
            return self.resolve(node.args[0])
        return None

    def is_environ(self, node: ast.AST) -> bool:
        return is_environ(node, self.environs[-1])

    # scopes ------------------------------------------------------------------------------------------------
    def _function(self, node: ast.AST) -> None:
        self.environs.append(set(ENVIRON_NAMES))
        self.loop_names.append({})
        self.generic_visit(node)
        self.environs.pop()
        self.loop_names.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def visit_Assign(self, node: ast.Assign) -> None:
        for t in node.targets:
            if isinstance(t, ast.Name):
                (self.environs[-1].add if self.is_environ(node.value) else self.environs[-1].discard)(t.id)
        self.generic_visit(node)

    def _bind_loop(self, target: ast.AST, iterable: ast.AST) -> None:
        if (  # for key, value in TABLE.items()
            isinstance(target, ast.Tuple)
            and target.elts
            and isinstance(iterable, ast.Call)
            and isinstance(iterable.func, ast.Attribute)
            and iterable.func.attr == "items"
        ):
            target, iterable = target.elts[0], iterable.func.value
        if isinstance(target, ast.Name):
            strings = self.resolve(iterable)
            if strings is not None:
                self.loop_names[-1][target.id] = strings

    def visit_For(self, node: ast.For) -> None:
        self._bind_loop(node.target, node.iter)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        self._bind_loop(node.target, node.iter)
        self.generic_visit(node)

    def _mark_tests(self, node: ast.AST) -> None:
        if isinstance(node, ast.BoolOp):
            for v in node.values:
                self._mark_tests(v)
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self._mark_tests(node.operand)
        else:
            self.tests.add(id(node))

    def visit_If(self, node: ast.If) -> None:
        self._mark_tests(node.test)
        self.generic_visit(node)

    visit_While = visit_IfExp = visit_Assert = visit_If

    def visit_FormattedValue(self, node: ast.FormattedValue) -> None:
        self.tests.add(id(node.value))  # a value shown in a message is not parsed
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        if id(node) in self.tests:
            for v in node.values:
                self._mark_tests(v)
        self.generic_visit(node)

    def visit_ListComp(self, node: ast.AST) -> None:
        generators = node.generators  # type: ignore[attr-defined]
        for gen in generators:  # the loops bind their names before the element reads them
            for cond in gen.ifs:
                self._mark_tests(cond)
            self.visit(gen)
        for field in ("elt", "key", "value"):
            if getattr(node, field, None) is not None:
                self.visit(getattr(node, field))

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp

    # reads -------------------------------------------------------------------------------------------------
    def _add(self, node: ast.AST, how: str, name_node: ast.AST | None, presence: bool = False) -> None:
        names = None if name_node is None else self.resolve(name_node)
        line = getattr(node, "lineno", 0)
        text = self.lines[line - 1].strip() if line else ""
        self.reads.append(Read(self.rel, line, text, how, None if names is None else frozenset(names), presence))

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and self.is_environ(node.value):
            self._add(node, "environ", node.slice, id(node) in self.tests)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)) and self.is_environ(right):
                self._add(node, "environ", node.left, presence=True)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        called = dotted(func)
        first = node.args[0] if node.args else None
        if called in ("os.getenv", "getenv"):
            self._add(node, "environ", first, id(node) in self.tests)
        elif isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and self.is_environ(func.value):
            self._add(node, "environ", first, id(node) in self.tests)
        else:
            origin = self._origin(func)
            if origin and origin[0] == "verl_patches.base.env_flags" and origin[1] in ENV_FLAGS_GETTERS:
                self._add(node, f"env_flags.{origin[1]}", first)
            elif origin and origin[0] == "verl_patches.base.env_registry" and origin[1] in REGISTRY_GETTERS:
                self._add(node, f"registry.{origin[1]}", first)
            callee = called.rsplit(".", 1)[-1]
            if callee in DECLARING_KEYWORDS:
                for kw in node.keywords:
                    if kw.arg == DECLARING_KEYWORDS[callee] and not (
                        isinstance(kw.value, ast.Constant) and kw.value.value in ("", None)
                    ):
                        self._add(kw.value, "declares", kw.value)
        self.generic_visit(node)

    def _origin(self, func: ast.AST) -> tuple[str, str] | None:
        if isinstance(func, ast.Name) and func.id in self.imported:
            return self.imported[func.id]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in self.modules:
            return self.modules[func.value.id], func.attr
        if self.rel.startswith("verl_patches/base/") and isinstance(func, ast.Name):
            module = _module_name(self.path)
            if module in ("verl_patches.base.env_flags", "verl_patches.base.env_registry"):
                return module, func.id
        return None


@pytest.fixture(scope="module")
def reads() -> list[Read]:
    trees = _Trees()
    out: list[Read] = []
    for path, tree in trees.trees.items():
        scanner = _Scanner(trees, path)
        scanner.visit(tree)
        out += scanner.reads
    return out


def _shown(read: Read) -> str:
    return f"{read.path}:{read.line}: {read.text}"


def test_the_scan_finds_the_reads_it_is_meant_to(reads: list[Read]) -> None:
    """The scan is not vacuous: known reads of each shape are found and resolved."""
    found = {(r.path, r.how, n) for r in reads for n in (r.names or ())}
    for expected in (
        ("verl_patches/base/host_device.py", "registry.text", "VERL_PATCHES_DEVICE"),  # a module constant
        ("verl_patches/rollout/dp_env.py", "environ", "HCCL_SOCKET_IFNAME"),  # a loop over a tuple constant
        ("verl_patches/patches/vllm_ascend/declarations.py", "declares", "VERL_PATCHES_KV_NZ"),  # an imported one
        ("verl_patches/launch/job.py", "environ", "VLLM_DP_MASTER_PORT"),  # a literal on an environ parameter
        ("verl_patches/patching/registry.py", "registry.flag", "VERL_PATCHES_QUIET"),
    ):
        assert expected in found, expected


def test_every_variable_read_is_registered(reads: list[Read]) -> None:
    missing = sorted(
        f"{_shown(r)}  ->  {n}" for r in reads for n in (r.names or ()) if lookup(n) is None and r.how != "environ!"
    )
    assert not missing, "read but not in verl_patches/base/env_registry.py:\n" + "\n".join(missing)


def test_parsed_variables_are_read_through_the_registry_getter_of_their_kind(reads: list[Read]) -> None:
    wrong = []
    for r in reads:
        for n in r.names or ():
            var = lookup(n)
            if var is None:
                continue
            if r.how == "environ" and var.kind != env_registry.TEXT and not r.presence:
                wrong.append(f"{_shown(r)}: {n} is a {var.kind}: read it with env_registry, which parses it")
            if r.how.startswith("registry."):
                kinds = REGISTRY_GETTERS[r.how.split(".")[1]]
                if kinds is not None and var.kind not in kinds:
                    wrong.append(f"{_shown(r)}: {n} is registered as a {var.kind}")
    assert not wrong, "\n".join(wrong)


def test_no_env_flags_getter_outside_base(reads: list[Read]) -> None:
    outside = [
        _shown(r)
        for r in reads
        if r.how.startswith("env_flags.")
        and not r.path.startswith("verl_patches/base/")
        and (r.path, r.text) not in ALLOWED
    ]
    assert not outside, "use verl_patches.base.env_registry (its default and bounds are the dry run's):\n" + "\n".join(
        outside
    )


def test_unresolved_reads_are_allowed_by_name(reads: list[Read]) -> None:
    unresolved = [
        _shown(r)
        for r in reads
        if r.names is None
        and not r.how.startswith("registry.")
        and r.path not in MACHINERY
        and (r.path, r.text) not in ALLOWED
    ]
    assert not unresolved, "a read whose name the scan cannot tell (name it, or list it in ALLOWED):\n" + "\n".join(
        unresolved
    )


def test_every_allowed_entry_still_matches(reads: list[Read]) -> None:
    seen = {(r.path, r.text) for r in reads}
    assert not [k for k in ALLOWED if k not in seen], "stale ALLOWED entries"


SHELL_READ = re.compile(r"\$\{?([A-Z][A-Z0-9_]*)")
SHELL_OWN = {"BASH_SOURCE", "HOME"}  # bash's own


def _shell_scripts() -> list[Path]:
    return sorted([*PACKAGE.rglob("*.sh"), *REPO.glob("*.sh")])


def test_shell_scripts_read_only_registered_variables() -> None:
    missing = []
    for script in _shell_scripts():
        for n, line in enumerate(script.read_text().splitlines(), 1):
            code = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
            for name in SHELL_READ.findall(code):
                if name not in SHELL_OWN and lookup(name) is None and not _assigned_in(script, name):
                    missing.append(f"{script.relative_to(REPO)}:{n}: {name}")
    assert not missing, "\n".join(missing)


def _assigned_in(script: Path, name: str) -> bool:
    """A shell variable the script sets itself (``py=...``) is not read from the environment."""
    return re.search(rf"(^|[\s;]){name}=", script.read_text(), re.M) is not None and name.islower()


def test_every_entry_names_owners_that_mention_it() -> None:
    stale = []
    for var in REGISTRY.values():
        mention = var.name.removesuffix(FAMILY_MARK)
        for owner in var.owners:
            path = REPO / owner
            if not path.is_file() or mention not in path.read_text():
                stale.append(f"{var.name}: owner {owner} does not mention it")
    assert not stale, "\n".join(stale)


def test_the_docs_table_is_the_registrys() -> None:
    """The one table of environment variables is on the page that documents them, generated from the registry."""
    page = (REPO / env_registry.DOC_PAGE).read_text(encoding="utf-8")
    assert env_registry.table_block() in page, (
        f"{env_registry.DOC_PAGE}'s table of environment variables is not the registry's: "
        f"python -m verl_patches.base.env_registry --write-docs {env_registry.DOC_PAGE}"
    )
    assert page.count(env_registry.TABLE_BEGIN) == 1
    assert docs_text.text().count(env_registry.TABLE_BEGIN) == 1  # no second copy in README or another page


def test_write_docs_replaces_the_table_and_nothing_else(tmp_path: Path, capsys) -> None:
    page = tmp_path / "environment.md"
    page.write_text(f"intro\n{env_registry.TABLE_BEGIN}\n| old |\n{env_registry.TABLE_END}\nrest\n")
    assert env_registry.main(["--write-docs", str(page)]) == 0
    assert page.read_text() == f"intro\n{env_registry.table_block()}\nrest\n"
    page.write_text("no markers\n")
    assert env_registry.main(["--write-docs", str(page)]) == 2
    assert "no '<!-- env-registry:begin" in capsys.readouterr().err and page.read_text() == "no markers\n"
    assert env_registry.main(["--markdown"]) == 0
    assert capsys.readouterr().out == env_registry.markdown_table()
