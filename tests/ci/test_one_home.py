"""One home for each small mechanism: `verl_patches/base/` (issue #33).

Outside ``verl_patches/base/``, no code of ours (verl_patches/, its scripts, bench/, tests/) may

* commit a file by renaming it (``os.replace``, ``Path.replace``, and outside tests ``os.rename`` /
  ``Path.rename``): `base.atomic_write` writes, flushes, renames and flushes the folder, honouring the umask.
  Tests may move fixtures with ``rename`` (an attack set up by hand is not a commit);
* make a temp file that outlives its handle (``tempfile.mkstemp``, ``mktemp``,
  ``NamedTemporaryFile(delete=False)``): mode 0600 breaks shared storage, and the names are not ours;
* parse a switch out of the environment, i.e. compare a value read from ``os.environ`` / ``environ`` /
  ``os.getenv`` against a boolean spelling ("1", "true", "off"...): `base.env_flags.env_flag` has the one
  grammar, and refuses what is not in it;
* read the device override (``VERL_PATCHES_DEVICE``, or its former name) itself: `base.host_device` does.

And nowhere but in its one home, tests included (``verl_patches/base/`` too):

* end a process with ``os._exit``: `base.rank_exit.exit_rank` (flushes first; its docstring says why a rank
  ends so);
* bind a socket to port 0 to be handed a free port: `base.free_port` (127.0.0.1 only, never all interfaces);
* start ranks: ``multiprocessing`` / ``torch.multiprocessing`` ``get_context``, ``spawn``, ``start_processes``,
  ``Process``, or ``subprocess.Popen`` in a loop of a function that sets ``RANK``: `verl_patches.multirank`
  (``run_ranks``, ``run_rank_scripts``) has the one deadline for all ranks, their stacks, the kill, the teardown.

And ``verl_patches/base/`` imports the standard library and itself only, so every layer may use it.

The checker is AST-based (a comment or a string never counts); `ALLOWED` lists the unavoidable exceptions,
each with its reason, and an entry that no longer matches anything fails too, so the list stays true.
"""

from __future__ import annotations

import ast
import functools
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ast_scan import dotted, is_environ

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("verl_patches", "bench", "tests")  # verl_patches/scripts/ is under verl_patches/
BASE = "verl_patches/base/"
BOOL_SPELLINGS = {"0", "1", "true", "false", "yes", "no", "on", "off", "y", "n", "t", "f", "enabled", "disabled"}
DEVICE_VARIABLES = {"VERL_PATCHES_DEVICE", "VERL_OVERLAY_DEVICE"}
RENAME_CALLS = {"replace", "rename"}
# file-or-folder renames that are not commits, allowed in tests only (fixtures moved by hand)
TEST_ONLY = {"rename"}
# the rules with one home each, anywhere in the tree: rule -> the file that is its home
HOMES = {
    "rank-exit": "verl_patches/base/rank_exit.py",
    "free-port": "verl_patches/base/free_port.py",
    "rank-spawn": "verl_patches/multirank.py",
}
# modules whose names the checker follows through imports (``from os import replace``, ``import ... as mp``)
TRACKED_MODULES = {"os", "tempfile", "subprocess", "multiprocessing", "torch", "torch.multiprocessing"}
RANK_STARTERS = {
    f"{module}.{name}"
    for module in ("multiprocessing", "torch.multiprocessing")
    for name in ("get_context", "spawn", "start_processes", "Process")
}

# (path relative to the repo, rule) -> why this one place cannot use verl_patches.base (or multirank)
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/rollout/test_dp_env.py", "free-port"): (
        "the test needs a port held busy (bound and listening) while the check under test looks at it; "
        "free_port hands out a port it has already released"
    ),
    ("bench/bench_reward.py", "rank-spawn"): (
        "a fork pool of math-verify graders for the baseline reward's timing: workers of one process, not ranks"
    ),
    ("tests/resilience/test_async_hang.py", "rank-spawn"): (
        "the code under test (CallWatch, playing the job's driver) is what watches these ranks and names the "
        "hung one: a harness that supervised them itself would take that job away from it"
    ),
}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.text}"


def _strings(node: ast.AST, constants: dict[str, set[str]]) -> set[str]:
    """The string literals ``node`` stands for: a literal, a tuple/list/set of them, or a module-level name
    bound to one of those."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out: set[str] = set()
        for elt in node.elts:
            out |= _strings(elt, constants)
        return out
    if isinstance(node, ast.Name):
        return constants.get(node.id, set())
    return set()


class _Scope:
    """Names bound, in one function (or the module), to the environment or to a value read from it."""

    def __init__(self, parent: _Scope | None = None) -> None:
        self.environs: set[str] = set(parent.environs) if parent else {"environ"}
        self.values: set[str] = set(parent.values) if parent else set()

    def is_environ(self, node: ast.AST) -> bool:
        return is_environ(node, self.environs)

    def is_env_read(self, node: ast.AST) -> bool:
        """``<environ>.get(...)``, ``<environ>[...]``, ``os.getenv(...)``, or a name bound to one of them."""
        node = _peel_read(node)
        if isinstance(node, ast.Call):
            func = node.func
            if dotted(func) in ("os.getenv", "getenv"):
                return True
            return isinstance(func, ast.Attribute) and func.attr == "get" and self.is_environ(func.value)
        if isinstance(node, ast.Subscript):
            return self.is_environ(node.value)
        return isinstance(node, ast.Name) and node.id in self.values


def _peel_read(node: ast.AST) -> ast.AST:
    """Method calls applied to a read value (``.strip().lower()``), but not the call that is the read."""
    while (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr not in ("get", "getenv")
    ):
        node = node.func.value
    return node


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, constants: dict[str, set[str]]) -> None:
        self.path, self.constants = path, constants
        self.in_base = path.startswith(BASE)
        self.in_tests = path.startswith("tests/")
        self.scope = _Scope()
        self.names: dict[str, str] = {}  # local name -> what it is, for TRACKED_MODULES (from os import replace)
        self.loops = 0  # loops and comprehensions around the node, in its function
        self.sets_rank = False  # its function (or the module) sets RANK: RANK=... or a "RANK" key
        self.found: list[Finding] = []

    def _add(self, node: ast.AST, rule: str, text: str) -> None:
        self.found.append(Finding(self.path, getattr(node, "lineno", 0), rule, text))

    # imports --------------------------------------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in TRACKED_MODULES and alias.asname:
                self.names[alias.asname] = alias.name
        if self.in_base:
            for alias in node.names:
                self._check_base_import(node, alias.name)
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in TRACKED_MODULES and node.level == 0:
            for alias in node.names:
                self.names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        if self.in_base and node.level == 0 and node.module:
            self._check_base_import(node, node.module)
        self.generic_visit(node)

    def _check_base_import(self, node: ast.AST, module: str) -> None:
        top = module.split(".")[0]
        if top == "__future__" or top in sys.stdlib_module_names or module.startswith("verl_patches.base"):
            return
        self._add(node, "base-imports", f"imports {module}: verl_patches/base uses the standard library only")

    def _resolve(self, dotted: str) -> str:
        """``mp.get_context`` -> ``torch.multiprocessing.get_context`` after ``import torch.multiprocessing as mp``."""
        head, dot, rest = dotted.partition(".")
        return self.names.get(head, head) + dot + rest

    # scopes: which names hold the environment or a value read from it -------------------------------------
    def _function(self, node: ast.AST) -> None:
        outer = self.scope, self.loops, self.sets_rank
        self.scope = _Scope(outer[0])
        if not isinstance(node, ast.Lambda):  # a lambda is part of the loop and the function it sits in
            self.loops, self.sets_rank = 0, _sets_rank(node)
        self.generic_visit(node)
        self.scope, self.loops, self.sets_rank = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Module(self, node: ast.Module) -> None:
        self.sets_rank = _sets_rank(node)
        self.generic_visit(node)

    def _loop(self, node: ast.AST) -> None:
        self.loops += 1
        self.generic_visit(node)
        self.loops -= 1

    visit_For = visit_AsyncFor = visit_While = _loop
    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _loop

    def visit_Assign(self, node: ast.Assign) -> None:
        self._bind(node.targets, node.value)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._bind([node.target], node.value)
        self.generic_visit(node)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self._bind([node.target], node.value)
        self.generic_visit(node)

    def _bind(self, targets: list[ast.expr], value: ast.AST) -> None:
        names = [t.id for t in targets if isinstance(t, ast.Name)]
        for name in names:
            self.scope.environs.discard(name)
            self.scope.values.discard(name)
            if self.scope.is_environ(value):
                self.scope.environs.add(name)
            elif self.scope.is_env_read(value):
                self.scope.values.add(name)

    # the rules ------------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        if not self.in_base:
            self._check_call(node)
        self._check_homes(node)
        self.generic_visit(node)

    def _check_homes(self, node: ast.Call) -> None:
        what = self._resolve(dotted(node.func))
        if what == "os._exit" and self.path != HOMES["rank-exit"]:
            self._add(node, "rank-exit", "os._exit(): end a rank with verl_patches.base.rank_exit.exit_rank")
        if _binds_port_zero(node) and self.path != HOMES["free-port"]:
            self._add(node, "free-port", ".bind((host, 0)): ask verl_patches.base.free_port for a port")
        if self.path != HOMES["rank-spawn"]:
            if what in RANK_STARTERS:
                self._add(node, "rank-spawn", f"{what}(): start ranks with verl_patches.multirank")
            elif what == "subprocess.Popen" and self.loops and self.sets_rank:
                self._add(
                    node, "rank-spawn", "Popen in a loop setting RANK: use verl_patches.multirank.run_rank_scripts"
                )

    def _check_call(self, node: ast.Call) -> None:
        func = node.func
        what = self._resolve(dotted(func))
        if what in ("os.replace", "os.rename"):
            name = what.split(".")[1]
            if not (self.in_tests and name in TEST_ONLY):
                self._add(node, "rename", f"{what}(): commit files with verl_patches.base.atomic_write")
        elif isinstance(func, ast.Attribute) and func.attr in RENAME_CALLS and _is_path_rename(node):
            if not (self.in_tests and func.attr in TEST_ONLY):
                self._add(node, "rename", f".{func.attr}(target): commit files with verl_patches.base.atomic_write")
        if what in ("tempfile.mkstemp", "tempfile.mktemp"):
            self._add(node, "mkstemp", f"{what}(): use verl_patches.base.atomic_write (0600, names not ours)")
        if what == "tempfile.NamedTemporaryFile" and any(
            k.arg == "delete" and isinstance(k.value, ast.Constant) and k.value.value is False for k in node.keywords
        ):
            self._add(node, "mkstemp", "NamedTemporaryFile(delete=False): use verl_patches.base.atomic_write")
        if self._reads_device_variable(node):
            self._add(node, "device-env", "reads the device override: use verl_patches.base.host_device")

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if not self.in_base and self.scope.is_environ(node.value) and self._names_device(node.slice):
            if isinstance(node.ctx, ast.Load):
                self._add(node, "device-env", "reads the device override: use verl_patches.base.host_device")
        self.generic_visit(node)

    def _reads_device_variable(self, node: ast.Call) -> bool:
        if not node.args:
            return False
        func = node.func
        is_read = dotted(func) in ("os.getenv", "getenv") or (
            isinstance(func, ast.Attribute) and func.attr == "get" and self.scope.is_environ(func.value)
        )
        return is_read and self._names_device(node.args[0])

    def _names_device(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in DEVICE_VARIABLES
        return dotted(node).split(".")[-1] in ("DEVICE_ENV", "STALE_DEVICE_ENV")

    def visit_Compare(self, node: ast.Compare) -> None:
        if not self.in_base:
            sides = [node.left, *node.comparators]
            if any(self.scope.is_env_read(_peel_read(s)) for s in sides):
                spelled = set().union(*(_strings(s, self.constants) for s in sides))
                flags = {s for s in spelled if s.strip().lower() in BOOL_SPELLINGS}
                if flags:
                    self._add(
                        node,
                        "env-flag",
                        f"environment value compared with {sorted(flags)}: use verl_patches.base.env_flags.env_flag",
                    )
        self.generic_visit(node)


def _sets_rank(node: ast.AST) -> bool:
    """``RANK=...`` (a keyword) or a ``"RANK"`` constant anywhere in `node`: it hands processes their rank."""
    return any(
        (isinstance(n, ast.keyword) and n.arg == "RANK") or (isinstance(n, ast.Constant) and n.value == "RANK")
        for n in ast.walk(node)
    )


def _binds_port_zero(node: ast.Call) -> bool:
    """``<socket>.bind((host, 0))``: the kernel picks a free port (0 is an int literal, not False)."""
    if not (isinstance(node.func, ast.Attribute) and node.func.attr == "bind" and len(node.args) == 1):
        return False
    address = node.args[0]
    if not (isinstance(address, ast.Tuple) and len(address.elts) == 2):
        return False
    port = address.elts[1]
    return isinstance(port, ast.Constant) and type(port.value) is int and port.value == 0


def _is_path_rename(node: ast.Call) -> bool:
    """``p.replace(target)`` / ``p.rename(target)``: one positional argument (str.replace takes two), no
    keywords (``datetime.replace(tzinfo=...)``, ``df.rename(columns=...)``), on something not a literal."""
    func = node.func
    assert isinstance(func, ast.Attribute)
    return (
        len(node.args) == 1
        and not node.keywords
        and not isinstance(node.args[0], ast.Starred)
        and not isinstance(func.value, ast.Constant)
    )


def _module_constants(tree: ast.Module) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, (ast.Tuple, ast.List, ast.Set)):
            values = _strings(stmt.value, {})
            for t in stmt.targets:
                if isinstance(t, ast.Name) and values:
                    out[t.id] = values
    return out


def findings(source: str, path: str) -> list[Finding]:
    """Every breach of the rules in ``source``, the text of the file at ``path`` (relative to the repo)."""
    tree = ast.parse(source, filename=path)
    checker = _Checker(path, _module_constants(tree))
    checker.visit(tree)
    return checker.found


def our_files() -> list[Path]:
    return sorted(p for root in ROOTS for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)


@functools.lru_cache(maxsize=1)
def tree_findings() -> tuple[Finding, ...]:
    out: list[Finding] = []
    for p in our_files():
        rel = p.relative_to(REPO).as_posix()
        out += findings(p.read_text(encoding="utf-8"), rel)
    return tuple(out)


# ---- the tree ------------------------------------------------------------------------------------------


def test_every_small_mechanism_has_one_home() -> None:
    found = tree_findings()
    refused = [f for f in found if (f.path, f.rule) not in ALLOWED]
    assert not refused, "outside verl_patches/base:\n" + "\n".join(map(str, refused))


def test_every_allowed_exception_is_still_needed() -> None:
    used = {(f.path, f.rule) for f in tree_findings()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


def test_the_old_copies_are_gone() -> None:
    for old in ("verl_patches/regular_file.py", "verl_patches/strict_int.py", "verl_patches/weights/atomic_io.py"):
        assert not (REPO / old).exists(), f"{old}: moved into verl_patches/base/, no copy may stay"


# ---- the checker itself, on the patterns it must refuse and the look-alikes it must not ----------------


@pytest.mark.parametrize(
    "source, rule",
    [
        # the write-then-rename copies the base replaced
        ("import os\ndef f(tmp, t):\n    os.replace(tmp, t)\n", "rename"),
        ("from os import replace\nreplace('a', 'b')\n", "rename"),
        ("def f(tmp, path):\n    tmp.replace(path)\n", "rename"),
        ("import os\nos.rename('a', 'b')\n", "rename"),
        ("def f(new, folder):\n    new.rename(folder)\n", "rename"),
        ("import tempfile\nfd, tmp = tempfile.mkstemp(dir='.')\n", "mkstemp"),
        ("from tempfile import mkstemp\nmkstemp()\n", "mkstemp"),
        ("import tempfile\nwith tempfile.NamedTemporaryFile('w', delete=False) as f:\n    pass\n", "mkstemp"),
        # the flag parsers the base replaced
        ("import os\nif os.environ.get('X') == '1':\n    pass\n", "env-flag"),
        ("import os\nq = os.environ.get('Q', '0') in ('', '0')\n", "env-flag"),
        ("import os\nq = os.getenv('Q', '').strip().lower() in ('1', 'true')\n", "env-flag"),
        (
            "import os\n_OFF = ('', '0', 'false', 'no', 'off')\n"
            "def on(environ=None):\n    raw = (os.environ if environ is None else environ).get('D')\n"
            "    return raw is not None and raw.strip().lower() not in _OFF\n",
            "env-flag",
        ),
        (
            "import os\ndef p(environ=None):\n    env = os.environ if environ is None else environ\n"
            "    return env.get('P', '0').strip() != '1'\n",
            "env-flag",
        ),
        ("import os\nx = os.environ['PREIMPORT'] == 'yes'\n", "env-flag"),
        # the device override read outside the base
        ("import os\nforced = os.environ.get('VERL_OVERLAY_DEVICE')\n", "device-env"),
        ("import os\nfrom x import DEVICE_ENV\nforced = os.environ.get(DEVICE_ENV)\n", "device-env"),
        # a rank's exit, a free port, ranks started: each has one home
        ("import os\ndef end():\n    os._exit(0)\n", "rank-exit"),
        ("from os import _exit as leave\nleave(3)\n", "rank-exit"),
        ("import socket\nwith socket.socket() as s:\n    s.bind(('127.0.0.1', 0))\n", "free-port"),
        ("import socket\ns = socket.socket(socket.AF_INET6)\ns.bind(('::1', 0))\n", "free-port"),
        ("import multiprocessing as mp\nctx = mp.get_context('spawn')\n", "rank-spawn"),
        ("import torch.multiprocessing as mp\nmp.spawn(print, nprocs=2)\n", "rank-spawn"),
        ("import torch\ntorch.multiprocessing.start_processes(print, nprocs=2)\n", "rank-spawn"),
        ("from torch import multiprocessing\nmultiprocessing.spawn(print)\n", "rank-spawn"),
        ("from multiprocessing import Process\nProcess(target=print).start()\n", "rank-spawn"),
        (
            "import os, subprocess\ndef start(n):\n"
            "    return [subprocess.Popen(['x'], env={**os.environ, 'RANK': str(r)}) for r in range(n)]\n",
            "rank-spawn",
        ),
        (
            "from subprocess import Popen\ndef start(n):\n    env = {}\n    for r in range(n):\n"
            "        env.update(RANK=str(r))\n        Popen(['x'], env=env)\n",
            "rank-spawn",
        ),
    ],
)
def test_the_checker_refuses(source: str, rule: str) -> None:
    got = findings(source, "verl_patches/example.py")
    assert [f.rule for f in got] == [rule], got


@pytest.mark.parametrize(
    "source",
    [
        "s = 'a.b'.replace('.', '/')\n",
        "def f(text):\n    return text.replace('a', 'b')\n",
        "import datetime\nd = datetime.datetime.now().replace(microsecond=0)\n",
        "def f(df):\n    return df.rename(columns={'a': 'b'})\n",
        "import tempfile\nwith tempfile.NamedTemporaryFile('w') as f:\n    pass\n",
        "import tempfile\nd = tempfile.mkdtemp()\n",
        "import os\nip = os.environ.get('VLLM_DP_MASTER_IP') != '10.0.0.2'\n",  # not a switch
        "def f(env):\n    return env['D2D'] == '1'\n",  # a dict of our making, not the environment
        "import os\nif os.environ.get('RAY_ADDRESS'):\n    pass\n",  # presence of a value, not a switch
        "import os\ncode = 'if os.environ.get(\"X\") == \"1\": os.replace(a, b)'\n",  # a string is not code
        "import os\nos.environ['VERL_PATCHES_DEVICE'] = 'cpu'\n",  # setting it for a child is fine
        "import sys\nsys.exit(3)\n",
        "code = 'import os; os._exit(0)'\n",  # in a child's code text: not code here
        "def serve(s, port):\n    s.bind(('127.0.0.1', port))\n",  # a port chosen elsewhere
        "def serve(s):\n    s.bind(('127.0.0.1', False))\n",  # not the literal 0
        "def f(path, s):\n    s.bind(str(path))\n",  # a Unix socket
        "def f(wg, names):\n    return wg.spawn(prefix_set=names)\n",  # verl's worker group (Ray actors)
        "import psutil\nrss = psutil.Process().memory_info().rss\n",
        "import subprocess\nfor m in ('a', 'b'):\n    subprocess.Popen(['python', '-m', m])\n",  # no RANK
        "import os, subprocess\np = subprocess.Popen(['x'], env=dict(os.environ, RANK='0'))\n",  # one, no loop
    ],
)
def test_the_checker_leaves_look_alikes_alone(source: str) -> None:
    assert findings(source, "verl_patches/example.py") == []


def test_tests_may_move_fixtures_but_not_commit_files() -> None:
    moving = "import os\ndef t(a, b):\n    os.rename(a, b)\n    a.rename(b)\n"
    assert findings(moving, "tests/x/test_x.py") == []
    assert [f.rule for f in findings(moving, "verl_patches/x.py")] == ["rename", "rename"]
    assert [f.rule for f in findings("import os\nos.replace('a', 'b')\n", "tests/x/test_x.py")] == ["rename"]


@pytest.mark.parametrize(
    "rule, source",
    [
        ("rank-exit", "import os\nos._exit(0)\n"),
        ("free-port", "import socket\nsocket.socket().bind(('127.0.0.1', 0))\n"),
        ("rank-spawn", "import multiprocessing\nctx = multiprocessing.get_context('spawn')\n"),
    ],
)
def test_each_home_alone_may_do_what_it_is_home_for(rule: str, source: str) -> None:
    home = HOMES[rule]
    assert findings(source, home) == []
    for elsewhere in ("verl_patches/base/other.py", "tests/x/test_x.py", "bench/b.py"):
        assert [f.rule for f in findings(source, elsewhere)] == [rule], elsewhere


def test_the_base_may_do_all_of_it_but_import_only_the_standard_library() -> None:
    inside = "import os\nimport json\nfrom verl_patches.base.strict_int import parse_int\nos.replace('a', 'b')\n"
    assert findings(inside, "verl_patches/base/x.py") == []
    for module in ("torch", "verl_patches.checkpoint.tracker", "numpy.linalg"):
        got = findings(f"import {module}\n", "verl_patches/base/x.py")
        assert [f.rule for f in got] == ["base-imports"] and module in got[0].text
    got = findings("from verl_patches.weights import errors\n", "verl_patches/base/x.py")
    assert [f.rule for f in got] == ["base-imports"]
