"""Find the attribute probes upstream code makes on torch_npu: ``hasattr(torch_npu..., "name")`` and
``getattr(torch_npu..., "name", default)``, where the object is torch_npu itself or an attribute path under it
(``torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options``), through any name the file binds torch_npu to
(``import torch_npu as tnpu``). Such a probe picks a code path by what the installed torch_npu has, so the
emulation must answer it as the real wheel does (tests/npu_emulation/test_wheel_contract.py).

AST-based: a comment or a string that merely contains such text never counts.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "torch_npu"


@dataclass(frozen=True)
class Probe:
    file: str  # relative to the scanned root
    line: int
    target: str  # "torch_npu" or "torch_npu.<path>"
    attribute: str
    kind: str  # "hasattr" or "getattr"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


def _aliases(tree: ast.Module) -> set[str]:
    """Names this file binds the torch_npu module to."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PACKAGE:
                    names.add(alias.asname or PACKAGE)
    return names


def _dotted(node: ast.expr, aliases: set[str]) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id in aliases:
        return ".".join([PACKAGE, *reversed(parts)])
    return None


def probes_in_source(text: str, file: str) -> list[Probe]:
    """Every torch_npu probe of one Python source (none when it does not parse)."""
    try:
        tree = ast.parse(text, file)
    except SyntaxError:
        return []
    aliases = _aliases(tree) | {PACKAGE}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        kind = node.func.id
        if kind not in ("hasattr", "getattr") or len(node.args) < 2:
            continue
        if kind == "getattr" and len(node.args) < 3 and not node.keywords:
            continue  # getattr without a default is an access, not a probe
        name = node.args[1]
        if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
            continue
        target = _dotted(node.args[0], aliases)
        if target is not None:
            found.append(Probe(file, node.lineno, target, name.value, kind))
    return found


def scan(root: Path, folders: Iterable[str]) -> list[Probe]:
    """Every probe in the Python files under ``root``/<folder> for each folder present, sorted by place."""
    found: list[Probe] = []
    for folder in folders:
        base = root / folder
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if PACKAGE in text:
                found.extend(probes_in_source(text, str(path.relative_to(root))))
    return sorted(found, key=lambda p: (p.file, p.line))


UPSTREAM_TREES = ("vllm_ascend", "mindspeed", "mindspeed_llm", "verl", "vllm", "megatron")
