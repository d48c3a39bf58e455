"""One reading of the job's layout and of ``overlay.*`` (issue 43, item 2).

`verl_patches/base/job_layout.py` derives the world, the training TP/PP/EP/CP/DP and the rollout's TP, engines
and vLLM instances from the composed config, and `verl_patches/base/overlay_settings.py` reads the ``overlay``
section typed. Outside those two homes, no code of ours (verl_patches/, bench/) may read a key they own or
repeat a derivation they hold. `RULES` names each rule, what it looks for and why; the checker is AST-based (a
comment or a docstring never counts), and reads are what it finds:

* ``get(cfg, KEY)`` / ``OmegaConf.select(cfg, KEY)`` / ``node.get(KEY)`` where KEY spells an owned key (a
  literal, an f-string ending in it, or a name bound to one), and ``cfg.trainer.nnodes``-style attribute chains;
* the derivations themselves, whatever the names: a product of a node count and a per-node count (the world),
  and a division or remainder by a ``tensor_model_parallel_size`` (engines, DP).

`ALLOWED` lists the exceptions, each with its reason; one that no longer matches anything fails too.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

from ast_scan import dotted

REPO = Path(__file__).resolve().parents[2]
ROOTS = ("verl_patches", "bench")
HOMES = {
    "world": "verl_patches/base/job_layout.py",
    "training": "verl_patches/base/job_layout.py",
    "rollout": "verl_patches/base/job_layout.py",
    "overlay": "verl_patches/base/overlay_settings.py",
}


@dataclass(frozen=True)
class Rule:
    name: str
    keys: tuple[str, ...]  # a read of a key that ends with one of these is the rule's
    use: str  # what to use instead
    why: str


MEGATRON = "actor_rollout_ref.actor.megatron."
RULES = (
    Rule(
        "world",
        ("trainer.nnodes", "trainer.n_gpus_per_node"),
        "job_layout(cfg).cluster (.world, .nodes, .dies_per_node)",
        "the world was nnodes x n_gpus_per_node in six places, each with its own int() and default",
    ),
    Rule(
        "training",
        tuple(
            MEGATRON + k
            for k in (
                "tensor_model_parallel_size",
                "pipeline_model_parallel_size",
                "expert_model_parallel_size",
                "context_parallel_size",
            )
        )
        + ("actor_rollout_ref.actor.ulysses_sequence_parallel_size",),
        "job_layout(cfg).training (.tp .pp .ep .cp .dp)",
        "the training DP is what TP x PP x CP leave of the world, checked against EP once",
    ),
    Rule(
        "rollout",
        ("actor_rollout_ref.rollout.tensor_model_parallel_size", "overlay.vllm_dp_size"),
        "job_layout(cfg).rollout (.tp .dp .dp_per_instance .instances .dp_groups)",
        "the rollout's engines and vLLM instances were derived in about six places with three different defaults",
    ),
    Rule(
        "overlay",
        ("overlay",),  # the section itself, or any key in it
        "overlay_settings(cfg).<name>",
        "every overlay key is typed and checked once; a misspelt key is refused instead of read as its default",
    ),
)
RULE = {r.name: r for r in RULES}
CONFIG_NAMES = ("cfg", "config", "conf")  # what our code calls a composed config

# (path relative to the repo, rule) -> why this one place reads the key itself
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    rule: str
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.text}; use {RULE[self.rule].use}"


def _key_rule(key: str) -> str | None:
    """The rule whose key ``key`` reads (``overlay.vllm_dp_size`` is the rollout's, not the overlay's)."""
    for rule in RULES:
        for owned in rule.keys:
            if key == owned or key.endswith("." + owned) or (rule.name == "overlay" and key.startswith("overlay.")):
                return rule.name
    return None


def _spelled(node: ast.AST, names: dict[str, str]) -> str | None:
    """The key ``node`` spells: a literal, a name bound to one, or an f-string (its text with each placeholder
    as ``*``, so ``f"{R}.tensor_model_parallel_size"`` ends with the key's tail)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant) and isinstance(v.value, str):
                parts.append(v.value)
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name) and v.value.id in names:
                parts.append(names[v.value.id])
            else:
                parts.append("*")
        return "".join(parts)
    return None


def _tail_rule(spelled: str) -> str | None:
    """For an f-string's text: the rule whose key its constant tail names (``*.tensor_model_parallel_size`` is a
    TP read of some section; the exact section is unknown, so any owned key's last part counts)."""
    if "*" not in spelled:
        return _key_rule(spelled)
    tail = spelled.rsplit("*", 1)[1]
    if spelled.startswith("overlay.") and tail:
        return "overlay" if _key_rule(spelled.replace("*", "x")) == "overlay" else _key_rule(spelled.replace("*", "x"))
    for rule in RULES:
        if rule.name != "overlay" and any(tail and ("." + k).endswith(tail) and "." in tail for k in rule.keys):
            return rule.name
    return None


def _mentions(node: ast.AST, word: str) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and word in n.id:
            return True
        if isinstance(n, ast.Attribute) and word in n.attr:
            return True
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and word in n.value:
            return True
    return False


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str, names: dict[str, str]) -> None:
        self.path, self.names = path, names
        self.found: list[Finding] = []

    def _add(self, node: ast.AST, rule: str, text: str) -> None:
        line = getattr(node, "lineno", 0)
        seen = any((f.line, f.rule) == (line, rule) for f in self.found)  # one line to fix, one finding
        if HOMES[rule] != self.path and not seen:
            self.found.append(Finding(self.path, line, rule, text))

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name in ("get", "select"):
            for arg in node.args[:2]:
                spelled = _spelled(arg, self.names)
                rule = _tail_rule(spelled) if spelled else None
                if rule:
                    self._add(node, rule, f"reads {spelled!r}")
                    break
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        chain = dotted(node)
        parts = chain.split(".")
        if isinstance(node.ctx, ast.Load) and len(parts) >= 2:
            for i in range(len(parts) - 1):
                rule = _key_rule(".".join(parts[i:]))
                # ``overlay.profile`` may be the typed view (`ctx.overlay`, a local ``overlay``): only a config's
                # own ``overlay`` section (``cfg.overlay``, ``self.config.overlay``) is a dotted read
                section = parts[i] in ("trainer", "rollout", "megatron", "actor") or (
                    parts[i] == "overlay" and i > 0 and parts[i - 1] in CONFIG_NAMES
                )
                if rule and section:
                    self._add(node, rule, f"reads {chain}")
                    return  # the inner attributes are this read
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Mult) and (
            (_mentions(node.left, "nnodes") and _mentions(node.right, "n_gpus_per_node"))
            or (_mentions(node.left, "n_gpus_per_node") and _mentions(node.right, "nnodes"))
        ):
            self._add(node, "world", "multiplies nodes by dies per node")
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and _mentions(node.right, "tensor_model_parallel_size"):
            self._add(node, "rollout", "divides by a tensor_model_parallel_size")
        self.generic_visit(node)


def _bound_strings(tree: ast.Module) -> dict[str, str]:
    """Names bound anywhere in the file to a string or an f-string of them, in file order
    (``R = "actor_rollout_ref.rollout"``, ``key = f"{R}.tensor_model_parallel_size"``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            spelled = _spelled(node.value, out)
            if spelled is not None:
                out[node.targets[0].id] = spelled
    return out


def _imported_strings(tree: ast.Module, modules: dict[str, dict[str, str]]) -> dict[str, str]:
    """Names imported from our modules that are strings there (``from ...val_subset import VAL_MAX_PROMPTS_KEY``)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            for alias in node.names:
                if alias.name in modules[node.module]:
                    out[alias.asname or alias.name] = modules[node.module][alias.name]
    return out


def findings(source: str, path: str, modules: dict[str, dict[str, str]] | None = None) -> list[Finding]:
    """The breaches in ``source`` (the file at ``path``); ``modules``: our modules' string constants, by dotted
    module name, for names the file imports."""
    tree = ast.parse(source, filename=path)
    names = {**_imported_strings(tree, modules or {}), **_bound_strings(tree)}
    checker = _Checker(path, names)
    checker.visit(tree)
    return checker.found


def _sources() -> dict[str, str]:
    return {
        p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8")
        for root in ROOTS
        for p in sorted((REPO / root).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


@functools.lru_cache(maxsize=1)
def tree_findings() -> tuple[Finding, ...]:
    sources = _sources()
    modules = {
        rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."): _bound_strings(ast.parse(text))
        for rel, text in sources.items()
    }
    out: list[Finding] = []
    for rel, text in sources.items():
        out += findings(text, rel, modules)
    return tuple(out)


# ---- the tree ------------------------------------------------------------------------------------------


def test_the_layout_and_the_overlay_are_read_in_their_homes_only() -> None:
    refused = [f for f in tree_findings() if (f.path, f.rule) not in ALLOWED]
    assert not refused, f"{len(refused)} second reading(s):\n" + "\n".join(map(str, refused))


def test_every_allowed_exception_is_still_needed() -> None:
    used = {(f.path, f.rule) for f in tree_findings()}
    stale = sorted(set(ALLOWED) - used)
    assert not stale, f"ALLOWED entries that match nothing any more (remove them): {stale}"


def test_every_home_exists() -> None:
    for rule, home in HOMES.items():
        assert (REPO / home).is_file(), f"{rule}: its home {home} is missing"


# ---- the checker itself --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source, rule",
    [
        ("w = int(get(cfg, 'trainer.nnodes')) * int(get(cfg, 'trainer.n_gpus_per_node'))\n", "world"),
        ("w = cfg.trainer.n_gpus_per_node\n", "world"),
        ("def f(nnodes, n_gpus_per_node):\n    return nnodes * n_gpus_per_node\n", "world"),
        ("e = world // tensor_model_parallel_size\n", "rollout"),
        ("R = 'actor_rollout_ref.rollout'\ntp = get(cfg, f'{R}.tensor_model_parallel_size')\n", "rollout"),
        ("dp = OmegaConf.select(cfg, 'overlay.vllm_dp_size', default=1)\n", "rollout"),
        ("key = 'overlay.vllm_dp_size'\ndp = get(cfg, key)\n", "rollout"),
        ("dp = int(cfg.overlay.vllm_dp_size)\n", "rollout"),
        ("M = 'actor_rollout_ref.actor.megatron'\npp = get(cfg, f'{M}.pipeline_model_parallel_size')\n", "training"),
        ("p = get(cfg, 'overlay.profile')\n", "overlay"),
        ("p = cfg.overlay.tiny_assets_dir\n", "overlay"),
        ("p = self.config.overlay.profile\n", "overlay"),
        ("o = cfg.get('overlay', {})\n", "overlay"),
        ("A = 'overlay.async_checkpoint'\non = bool(get(cfg, A, False))\n", "overlay"),
    ],
)
def test_the_checker_refuses(source: str, rule: str) -> None:
    got = findings(source, "verl_patches/example.py")
    assert [f.rule for f in got] == [rule], got


@pytest.mark.parametrize(
    "source",
    [
        "overrides = [f'trainer.nnodes={n}', 'overlay.vllm_dp_size=2']\n",  # writes, not reads
        "msg = f'{ROLLOUT_TP_KEY}={tp} does not divide the world'\n",
        "tp = int(config.get('tensor_model_parallel_size', 1))\n",  # a section handed in, no job key
        "args.tensor_model_parallel_size = tp\n",  # Megatron's argument, written
        "world = layout.world\nengines = layout.rollout.dp\n",
        "def f():\n    '''reads trainer.nnodes x trainer.n_gpus_per_node'''\n",
        "p = ctx.overlay.profile\noverlay = overlay_settings(cfg)\nd = overlay.dies_per_card\n",  # the typed view
        "x = get(cfg, 'trainer.device')\n",
        "n = settings.int('NNODES') * settings.int('NPUS_PER_NODE')\n",
    ],
)
def test_the_checker_leaves_look_alikes_alone(source: str) -> None:
    assert findings(source, "verl_patches/example.py") == []


def test_a_key_imported_from_another_module_is_followed() -> None:
    modules = {"verl_patches.data.val_subset": {"KEY": "overlay.val_max_prompts"}}
    source = "from verl_patches.data.val_subset import KEY as K\nn = get(cfg, K)\n"
    assert [f.rule for f in findings(source, "verl_patches/example.py", modules)] == ["overlay"]


def test_each_home_reads_its_own_keys() -> None:
    assert findings("n = get(cfg, 'trainer.nnodes')\n", HOMES["world"]) == []
    assert findings("s = get(cfg, 'overlay')\n", HOMES["overlay"]) == []
    assert [f.rule for f in findings("s = get(cfg, 'overlay.profile')\n", HOMES["world"])] == ["overlay"]
