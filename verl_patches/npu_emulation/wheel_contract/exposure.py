"""Which attributes the real ``torch_npu`` module has after ``import torch_npu``, read from the wheel's Python.

torch_npu binds them in these ways, each read statically here (nothing is imported):

* ``utils/custom_ops.py``: ``torch_npu.<op> = torch.ops.npu.<op>`` for every op it exposes (then
  ``__init__.py``'s loop over ``dir(torch.ops.npu)`` re-binds the same packets: ``dir`` of an op namespace lists
  only the ops already looked up, which are these);
* ``op_plugin/atb/_atb_ops.py``: the module ``torch_npu.atb`` and, at top level, every name of ``API_LIST``;
* ``__init__.py``'s own top-level bindings (imports, functions, assignments, its loop variable) and the
  subpackages it imports (``import torch_npu.npu`` sets ``torch_npu.npu``);
* any other module of the wheel that assigns ``torch_npu.<name> = ...`` (``npu/_format.py``: ``Format``, ...).

`wheel_attributes` returns each name with where it comes from; a name not there is one the real module lacks.
"""

from __future__ import annotations

import ast
import re

_ASSIGNED = re.compile(r"^\s*torch_npu\.([A-Za-z_][A-Za-z0-9_]*)\s*=[^=]", re.MULTILINE)


def _import_bindings(node: ast.Import | ast.ImportFrom, package: str) -> dict[str, str]:
    found: dict[str, str] = {}
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if alias.asname:
                found[alias.asname] = "import"
            elif parts[0] == package and len(parts) > 1:
                found[parts[1]] = "subpackage import"
            else:
                found[parts[0]] = "import"
        return found
    module = node.module or ""
    parts = module.split(".")
    if parts[0] == package and len(parts) > 1:
        found[parts[1]] = "subpackage import"
    for alias in node.names:
        found[alias.asname or alias.name] = "import"
    return found


def _top_level_bindings(tree: ast.Module, package: str) -> dict[str, str]:
    names: dict[str, str] = {}

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update(_import_bindings(node, package))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names[node.name] = "definition"
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names[leaf.id] = "assignment"
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                for leaf in ast.walk(node.target):
                    if isinstance(leaf, ast.Name):
                        names[leaf.id] = "loop variable"
                visit(node.body)
            elif isinstance(node, ast.Delete):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.pop(target.id, None)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return names


def _atb(atb_ops_source: str, member: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for node in ast.parse(atb_ops_source, member).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            target = node.targets[0].id
            if target == "API_LIST":
                for name in ast.literal_eval(node.value):
                    found[name] = f"{member}: API_LIST"
            elif target == "ATB_MODULE_NAME":
                found[ast.literal_eval(node.value)] = f"{member}: ATB_MODULE_NAME (the torch_npu.atb module)"
    return found


def wheel_attributes(python_sources: dict[str, str], package: str = "torch_npu") -> dict[str, str]:
    """name -> where the wheel binds it on the ``torch_npu`` module, from the wheel's Python files
    (member path -> text)."""
    found: dict[str, str] = {}
    custom_ops = f"{package}/utils/custom_ops.py"  # named first: the op's own exposure, before any re-binding
    for member, text in sorted(python_sources.items(), key=lambda item: (item[0] != custom_ops, item[0])):
        for m in _ASSIGNED.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            found.setdefault(m.group(1), f"{member}:{line}")
    init = f"{package}/__init__.py"
    for name, how in _top_level_bindings(ast.parse(python_sources[init], init), package).items():
        found[name] = f"{init}: {how}"
    found.update(_atb(python_sources[f"{package}/op_plugin/atb/_atb_ops.py"], f"{package}/op_plugin/atb/_atb_ops.py"))
    return found
