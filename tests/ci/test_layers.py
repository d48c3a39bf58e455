"""The layer order of verl_patches, written down once (`LAYERS`) and kept by reading every import.

A unit is a top-level package of verl_patches (``sync/``) or a top-level module (``device.py``). The import
graph counts every ``import`` and ``from ... import`` statement, at module level or inside a function,
absolute or relative (``from . import x``, ``from ..y import z``), under ``if TYPE_CHECKING:`` too. It holds:

* no cycle between units;
* no import from a unit to one in a higher layer (units of one layer may import each other, cycles aside);
* every import inside a function has its reason beside it: a comment on its line, or a comment line right
  above it (one comment line above a run of consecutive imports covers the run). A deferred import is an
  edge that runs only sometimes; the reason says when and why, so a reader need not guess whether it is
  hiding a cycle. Imports under ``if TYPE_CHECKING:`` never run and need none;
* no production module imports the CPU proof or the torch_npu emulation (`NOT_PRODUCTION`): the emulation is
  installed by the one switch (`prelude_patch`) and by declared CPU-only patches, each importer named with its
  reason in `EMULATION_IMPORTERS`, and a patches module there is named by CPU-only declarations alone;
* the generic multi-rank harness (`multirank`) imports nothing of the overlay (`MULTIRANK_IMPORTS`): its caller
  names what a rank imports.

`patches` and `patching` are the one pair that used to need each other: the patches import the machinery (their
`Patch` declarations), and the machinery never imports the patches; the activation point (`prelude_patch`) and
the reports (`audit`, the launcher's preflight) hand it the catalog.

References by name are not imports and are not counted: a declaration's ``lazy_call("module:attr")``, the
catalog's list of declaration modules, Ray's ``worker_process_setup_hook``. They are data a lower layer holds,
resolved when upstream code calls them, after the importing is done. They name modules of `patches` itself
(its adapters): what a patch installs from a lower unit (the driver's fit loop, the engines) the adapter imports.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

import docs_text

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "verl_patches"

# Lowest first. Units of one layer may import each other; no unit imports one of a higher layer.
LAYERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("base",), "standard library only: one home for each small mechanism, usable before anything is installed"),
    (("npu_emulation",), "torch_npu written in plain torch: in place before anything asks for torch_npu"),
    (("device",), "npu | cuda | cpu: the one place that asks which accelerator this process drives"),
    (("sources",), "setup time (lock, routes, tree hashes, pins): runs before torch or any upstream exists"),
    (
        ("process_identity", "compile_toggle", "tools", "profiler", "multirank"),
        "small runtime helpers that know nothing of verl: processes, torch.compile, memory logs, profiling, "
        "N ranks of this host over gloo (the checks', benchmarks' and tests' harness)",
    ),
    (("patching",), "the patch machinery (declare, fingerprint, apply, activate in every process): knows no patch"),
    (
        ("data", "reward", "reshard", "worker_calls"),
        "pure logic: data prep, the reward, reshard planners, what the driver and its workers exchange",
    ),
    (("checkpoint",), "the step checkpoint's format and its strict readers (manifest, tracker, safe .pt load)"),
    (("weights",), "model-weight formats and converters; reads checkpoints through checkpoint's readers"),
    (("resilience",), "progress marks, heartbeats and bounded waits: used by the engines and the driver alike"),
    (("train_engine", "rollout"), "the two engines: Megatron/MindSpeed training, vLLM/vllm-ascend rollout"),
    (("sync",), "weight sync from the training engine into the rollout engine"),
    (
        ("driver",),
        "the driver's step: the fit loop and its plan, the fused role, per-step lines, memory, curves, config rules",
    ),
    (("patches",), "declarations and adapters that install everything below into upstream code"),
    (("prelude_patch",), "the activation point: the catalog of patches handed to the machinery"),
    (("trainer",), "the job's entry that activates the patches, and its config composed over verl's own"),
    (
        ("cpu_proof",),
        "the CPU proof: its entry (the trainer's, the tiny assets built first), the assets, the golden check",
    ),
    (("launch",), "cluster bring-up, preflight and the job around the trainer entry"),
    (("audit",), "the report of every difference from upstream: reads sources, patches and the rest"),
    (("checks", "scripts"), "command-line tools on top of everything"),
)


# Units that are not production code; no production module imports them (test_production_never_imports_...)
NOT_PRODUCTION: dict[str, str] = {
    "cpu_proof": "the CPU proof: the tiny run on one CPU machine and the check that it learned",
    "npu_emulation": "torch_npu, torchair and acl in plain torch on a CPU host: the CPU proof's device",
}
# The production modules that may import the emulation, each with its reason (never the CPU proof: none may)
EMULATION_IMPORTERS: dict[str, str] = {
    "verl_patches.prelude_patch": "the one switch: installs the emulation in every process it activates, on a CPU "
    "host only (a no-op where a real torch_npu is installed)",
    "verl_patches.device": "tells our stand-in torch_npu from a real one: a CPU host with the stand-in is no NPU host",
    "verl_patches.audit": "lists every emulated op and what a CPU cannot run (the audit's contract); installs nothing",
    "verl_patches.patches.mindspeed.op_builder": "CPU-only patches: MindSpeed's op builders hand out the emulated ops",
    "verl_patches.patches.vllm.engine.fp32_on_cpu": "CPU-only patch: the CPU proof's fp32 rollout declares its model",
    "verl_patches.patches.verl.workers.rollout.emulated_npu": "CPU-only patch: the A3 rollout engine on the emulated "
    "npu device",
}
# What the generic multi-rank harness may import: nothing of the overlay (its caller names what a rank imports)
MULTIRANK_IMPORTS: dict[str, str] = {"base": "free ports and the rank-exit rule, standard library only"}


@dataclass(frozen=True)
class Edge:
    file: Path
    line: int
    importer: str  # dotted module name
    imported: str  # dotted module name (the module itself where `from pkg import module` names one)
    in_function: bool
    type_checking: bool

    def where(self, root: Path) -> str:
        return f"{self.file.relative_to(root)}:{self.line}"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> file, for every Python file of ``package`` under ``root``."""
    files = sorted(p for p in (root / package).rglob("*.py") if "__pycache__" not in p.parts)
    return {module_name(p, root): p for p in files}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.Import | ast.ImportFrom, importer: str, is_package: bool, modules: set[str]) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = importer.split(".") if is_package else importer.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names]


class _Imports(ast.NodeVisitor):
    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []
        self._functions = 0
        self._type_checking = 0

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self._functions += 1
        self.generic_visit(node)
        self._functions -= 1

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        self._type_checking += 1
        for child in node.body:
            self.visit(child)
        self._type_checking -= 1
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        self.found.append((node, self._functions > 0, self._type_checking > 0))

    visit_ImportFrom = visit_Import


def import_edges(root: Path, package: str = PACKAGE) -> list[Edge]:
    """Every import statement of ``package`` as edges to the modules it names (ours and others')."""
    files = package_files(root, package)
    names = set(files)
    edges = []
    for importer, path in files.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for node, in_function, type_checking in visitor.found:
            for target in _targets(node, importer, path.name == "__init__.py", names):
                edges.append(Edge(path, node.lineno, importer, target, in_function, type_checking))
    return edges


def unit_of(module: str, package: str = PACKAGE) -> str | None:
    """The top-level package or module of ours that ``module`` belongs to; None for the package itself or for
    a module that is not ours."""
    parts = module.split(".")
    if parts[0] != package or len(parts) < 2:
        return None
    return parts[1]


def unit_edges(edges: list[Edge], package: str = PACKAGE) -> dict[tuple[str, str], list[Edge]]:
    out: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        a, b = unit_of(e.importer, package), unit_of(e.imported, package)
        if a and b and a != b:
            out.setdefault((a, b), []).append(e)
    return out


def cycles(graph: dict[tuple[str, str], list[Edge]]) -> list[list[str]]:
    """Strongly connected groups of more than one unit (Tarjan), each sorted, in sorted order."""
    succ: dict[str, set[str]] = {}
    for a, b in graph:
        succ.setdefault(a, set()).add(b)
        succ.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return sorted(groups)


def cycle_problems(edges: list[Edge], root: Path, package: str = PACKAGE) -> list[str]:
    graph = unit_edges(edges, package)
    out = []
    for group in cycles(graph):
        inside = [(a, b) for (a, b) in sorted(graph) if a in group and b in group]
        shown = "; ".join(
            f"{a} -> {b} ({graph[a, b][0].where(root)} imports {graph[a, b][0].imported})" for a, b in inside
        )
        out.append(f"cycle between {', '.join(group)}: {shown}")
    return out


def layer_rank(layers: tuple[tuple[tuple[str, ...], str], ...]) -> dict[str, int]:
    return {unit: i for i, (units, _) in enumerate(layers) for unit in units}


def upward_problems(edges: list[Edge], root: Path, layers, package: str = PACKAGE) -> list[str]:
    rank = layer_rank(layers)
    out = []
    for (a, b), found in sorted(unit_edges(edges, package).items()):
        if a in rank and b in rank and rank[b] > rank[a]:
            out += [
                f"{e.where(root)}: {e.importer} imports {e.imported}, up the layers ({a}: layer {rank[a]}, "
                f"{b}: layer {rank[b]})"
                for e in found
            ]
    return list(dict.fromkeys(out))  # `from x import a, b` is one line to fix, not two


def unplaced_units(root: Path, layers, package: str = PACKAGE) -> tuple[set[str], set[str]]:
    """(units that exist but have no layer, layer names that name no unit)."""
    present = {unit_of(m, package) for m in package_files(root, package)} - {None}
    placed = set(layer_rank(layers))
    return present - placed, placed - present


_NOT_A_REASON = re.compile(r"noqa(:\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*)?|type:\s*ignore(\[[^\]]*\])?|pragma:?\s*\S+")


def _is_reason(comment: str) -> bool:
    """A comment that says something: two words or more once lint directives are taken out."""
    text = _NOT_A_REASON.sub(" ", comment.lstrip("#"))
    return len(re.findall(r"[A-Za-z]{2,}", text)) >= 2


def _comments(source: str) -> dict[int, str]:
    return {
        tok.start[0]: tok.string
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }


def _runs_of_imports(tree: ast.AST) -> dict[int, int]:
    """Line of an import statement -> line of the first import of the run of consecutive imports it ends,
    for statements that directly follow another import in the same block."""
    first_of: dict[int, int] = {}
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if not isinstance(block, list):
                continue
            for prev, stmt in zip(block, block[1:]):
                imports = (ast.Import, ast.ImportFrom)
                if isinstance(prev, imports) and isinstance(stmt, imports) and stmt.lineno == prev.end_lineno + 1:
                    first_of[stmt.lineno] = first_of.get(prev.lineno, prev.lineno)
    return first_of


def _reason_above(line: int, lines: list[str], comments: dict[int, str]) -> bool:
    """Whether the line above ``line`` is a comment line that gives a reason."""
    above = line - 1
    return above >= 1 and lines[above - 1].lstrip().startswith("#") and _is_reason(comments.get(above, ""))


def unexplained_function_imports(root: Path, package: str = PACKAGE) -> list[str]:
    """`file:line` of every import inside a function with no reason beside it."""
    out = []
    for path in package_files(root, package).values():
        source = path.read_text()
        tree = ast.parse(source, str(path))
        visitor = _Imports()
        visitor.visit(tree)
        lines = source.splitlines()
        comments = _comments(source)
        first_of = _runs_of_imports(tree)

        for node, in_function, type_checking in visitor.found:
            if not in_function or type_checking:
                continue
            own = any(_is_reason(comments.get(n, "")) for n in range(node.lineno, node.end_lineno + 1))
            if (
                own
                or _reason_above(node.lineno, lines, comments)
                or _reason_above(first_of.get(node.lineno, node.lineno), lines, comments)
            ):
                continue
            what = ast.get_source_segment(source, node) or ""
            out.append(
                f"{path.relative_to(root)}:{node.lineno}: `{' '.join(what.split())}` inside a function, no reason"
            )
    return out


# ------------------------------------------------------------------------------------------ the real tree


@pytest.fixture(scope="module")
def edges() -> list[Edge]:
    return import_edges(REPO)


def test_every_unit_has_a_layer_and_every_layer_names_a_unit() -> None:
    missing, stale = unplaced_units(REPO, LAYERS)
    assert not missing, f"place these in LAYERS (tests/ci/test_layers.py), with the reason for their layer: {missing}"
    assert not stale, f"LAYERS names units that no longer exist: {stale}"
    assert LAYERS[0][0] == ("base",)


def test_no_cycle_between_packages(edges) -> None:
    problems = cycle_problems(edges, REPO)
    assert not problems, "\n".join(problems)


def test_no_import_goes_up_the_layers(edges) -> None:
    problems = upward_problems(edges, REPO, LAYERS)
    assert not problems, "\n".join(problems)


def test_imports_inside_functions_say_why() -> None:
    problems = unexplained_function_imports(REPO)
    assert not problems, f"{len(problems)} import(s) inside functions without a reason:\n" + "\n".join(problems)


def production_imports(
    edges: list[Edge], allowed: dict[str, dict[str, str]], root: Path = REPO, package: str = PACKAGE
) -> list[str]:
    """`file:line` of every import of a `NOT_PRODUCTION` unit by a production module not in `allowed`."""
    out = []
    for e in edges:
        a, b = unit_of(e.importer, package), unit_of(e.imported, package)
        if b in NOT_PRODUCTION and a not in NOT_PRODUCTION and a != b and e.importer not in allowed.get(b, {}):
            out.append(f"{e.where(root)}: {e.importer} imports {e.imported} ({b}: {NOT_PRODUCTION[b]})")
    return list(dict.fromkeys(out))


def test_production_never_imports_the_cpu_proof_or_the_emulation(edges) -> None:
    problems = production_imports(edges, {"npu_emulation": EMULATION_IMPORTERS})
    assert not problems, "\n".join(problems)
    importers = {e.importer for e in edges if unit_of(e.imported) == "npu_emulation"} - {
        m for m in package_files(REPO) if unit_of(m) == "npu_emulation"
    }
    assert not set(EMULATION_IMPORTERS) - importers, "EMULATION_IMPORTERS names modules that import no emulation"


def test_the_emulations_patch_importers_are_named_by_cpu_only_declarations_alone() -> None:
    from verl_patches.patches.catalog import all_patches
    from verl_patches.patching.declaration import CPU_ONLY

    modules = {m for m in EMULATION_IMPORTERS if unit_of(m) == "patches"}
    named = {m: [] for m in modules}
    for p in all_patches():
        path = re.search(r"\('([\w.]+):", getattr(p.replacement, "__qualname__", "")) if p.replacement else None
        if path and path.group(1) in named:
            named[path.group(1)].append((p.name, p.devices))
    assert all(named.values()), f"no declaration names {[m for m, ps in named.items() if not ps]}"
    wider = {m: [(n, d) for n, d in ps if d != CPU_ONLY] for m, ps in named.items()}
    assert not any(wider.values()), f"declared beyond the CPU: {wider}"


def test_the_multirank_harness_imports_no_overlay(edges) -> None:
    found = {unit_of(e.imported) for e in edges if unit_of(e.importer) == "multirank"} - {None, "multirank"}
    extra = sorted(found - set(MULTIRANK_IMPORTS))
    assert not extra, f"verl_patches/multirank.py imports {extra}: its caller names what a rank imports (preload)"


def test_the_package_root_imports_nothing(edges) -> None:
    assert [e.where(REPO) for e in edges if e.importer == PACKAGE] == []


def test_the_docs_what_is_where_names_every_unit() -> None:
    """A newcomer finds every package and top-level module of verl_patches in the documentation's table."""
    table = docs_text.section("What is where")
    units = {unit_of(m) for m in package_files(REPO)} - {None}
    missing = sorted(u for u in units if f"`{PACKAGE}/{u}/`" not in table and f"`{PACKAGE}/{u}.py`" not in table)
    assert not missing, f"'What is where' (docs/architecture.md) does not name: {missing}"


# ------------------------------------------------------------------------------- the checks themselves


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / "pkg" / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_relative_and_function_imports_are_edges(tmp_path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low/__init__.py": "",
            "low/a.py": "from . import b\nfrom .b import thing\n",
            "low/b.py": "def f():\n    from ..high import c  # deferred: a test of the finder\n",
            "high/__init__.py": "from .c import x\n",
            "high/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.low import a\n",
        },
    )
    got = {(e.importer, e.imported, e.in_function, e.type_checking) for e in import_edges(root, "pkg")}
    assert ("pkg.low.a", "pkg.low.b", False, False) in got  # `from . import b`: the module b
    assert ("pkg.low.b", "pkg.high.c", True, False) in got  # two dots, inside a function
    assert ("pkg.high", "pkg.high.c", False, False) in got  # an __init__'s `.` is the package itself
    assert ("pkg.high.c", "pkg.low.a", False, True) in got
    assert unit_edges(import_edges(root, "pkg"), "pkg").keys() == {("low", "high"), ("high", "low")}


def test_a_cycle_and_an_upward_import_are_named_with_file_and_line(tmp_path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "import os\n\n\ndef f():\n    import pkg.high  # deferred: hides nothing from the test\n",
            "high.py": "from pkg import low\n",
            "top.py": "from pkg import high\n",
        },
    )
    edges = import_edges(root, "pkg")
    assert cycle_problems(edges, root, "pkg") == [
        "cycle between high, low: high -> low (pkg/high.py:1 imports pkg.low); "
        "low -> high (pkg/low.py:5 imports pkg.high)"
    ]
    layers = ((("low",), "why"), (("high", "top"), "why"))
    assert upward_problems(edges, root, layers, "pkg") == [
        "pkg/low.py:5: pkg.low imports pkg.high, up the layers (low: layer 0, high: layer 1)"
    ]
    assert unplaced_units(root, ((("low", "gone"), "why"),), "pkg") == ({"high", "top"}, {"gone"})


def test_an_import_inside_a_function_needs_a_reason_beside_it(tmp_path) -> None:
    body = (
        "from typing import TYPE_CHECKING\n"  # 1
        "import json\n"  # 2: module level, fine
        "\n"
        "def f():\n"  # 4
        "    import torch\n"  # 5: no reason
        "    import numpy  # noqa: F401\n"  # 6: a directive is not a reason
        "    # lazy: torch is heavy and the CLI must start without it\n"
        "    import torch.nn\n"  # 8: reason above
        "    import torch.optim\n"  # 9: same run, covered
        "    x = 1\n"
        "    import torch.fx\n"  # 11: a new run, no reason
        "    import math  # deferred: only this rare path needs it\n"  # 12: reason on the line
        "    if TYPE_CHECKING:\n"
        "        import collections\n"  # 14: never runs
        "    return x\n"
    )
    root = _tree(tmp_path, {"__init__.py": "", "m.py": body})
    assert unexplained_function_imports(root, "pkg") == [
        "pkg/m.py:5: `import torch` inside a function, no reason",
        "pkg/m.py:6: `import numpy` inside a function, no reason",
        "pkg/m.py:11: `import torch.fx` inside a function, no reason",
    ]


def test_an_import_of_the_cpu_proof_or_the_emulation_is_named_unless_allowed(tmp_path) -> None:
    root = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "cpu_proof/__init__.py": "",
            "cpu_proof/entry.py": "from pkg.npu_emulation import ops\nfrom pkg import engine\n",
            "npu_emulation/__init__.py": "",
            "npu_emulation/ops.py": "",
            "engine.py": "def f():\n    from pkg.npu_emulation import ops  # deferred: a test of the finder\n",
            "switch.py": "from pkg.npu_emulation import ops\n",
            "report.py": "from pkg.cpu_proof import entry\n",
        },
    )
    edges = import_edges(root, "pkg")
    allowed = {"npu_emulation": {"pkg.switch": "the one switch"}}
    assert production_imports(edges, allowed, root, "pkg") == [
        "pkg/engine.py:2: pkg.engine imports pkg.npu_emulation.ops (npu_emulation: "
        + NOT_PRODUCTION["npu_emulation"]
        + ")",
        "pkg/report.py:1: pkg.report imports pkg.cpu_proof.entry (cpu_proof: " + NOT_PRODUCTION["cpu_proof"] + ")",
    ]
