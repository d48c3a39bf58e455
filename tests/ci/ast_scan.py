"""What the CI's AST checkers (test_one_home, test_env_registry) both ask of an expression: the dotted name it is
made of, and whether it stands for the environment."""

from __future__ import annotations

import ast
from collections.abc import Collection


def dotted(node: ast.AST) -> str:
    """``os.environ.get`` for that attribute chain; '' for anything that is not names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return ""


def is_environ(node: ast.AST, environs: Collection[str]) -> bool:
    """``os.environ``, a name in ``environs`` (bound to the environment in this scope), a ``dict()`` copy of one, or
    an expression made of them (``os.environ if environ is None else environ``)."""
    if isinstance(node, ast.IfExp):
        return is_environ(node.body, environs) or is_environ(node.orelse, environs)
    if isinstance(node, ast.BoolOp):
        return any(is_environ(v, environs) for v in node.values)
    if isinstance(node, ast.Call) and dotted(node.func) == "dict" and node.args:
        return is_environ(node.args[0], environs)
    name = dotted(node)
    return name == "os.environ" or name in environs
