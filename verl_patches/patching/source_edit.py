"""Upstream functions compiled again from their own source with one reviewed edit: the one home of the
mechanism behind the "new body" patches that change a statement of upstream code rather than wrap it.

`recompile(original, edit)` parses the pinned source of `original` (the fingerprint the patch declares makes
that source the reviewed one), lets `edit` change the function's AST in place, and compiles the result in
upstream's module (its globals, its file name, its line numbers), inside a factory that provides the
`__class__` cell zero-argument ``super()`` needs. `edit` raises `SourceEditError` when the statement it
changes is not found exactly once: nothing is patched then, and the message says what was looked for.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from collections.abc import Callable
from typing import Any


class SourceEditError(RuntimeError):
    """The statement an edit changes is not in upstream's source as reviewed."""


def recompile(original: Callable[..., Any], edit: Callable[[ast.FunctionDef], None]) -> Callable[..., Any]:
    """`original` compiled again from its source after `edit` changed its function definition."""
    source_lines, first_line = inspect.getsourcelines(original)
    tree = ast.parse(textwrap.dedent("".join(source_lines)))
    fn = tree.body[0]
    if not isinstance(fn, ast.FunctionDef) or fn.decorator_list:
        raise SourceEditError(f"{original.__qualname__}: expected a plain function definition")
    edit(fn)
    ast.increment_lineno(tree, first_line - 1)
    factory = ast.FunctionDef(
        name="_factory",
        args=ast.arguments(posonlyargs=[], args=[ast.arg("__class__")], kwonlyargs=[], kw_defaults=[], defaults=[]),
        body=[fn, ast.Return(ast.Name(fn.name, ast.Load()))],
        decorator_list=[],
        returns=None,
    )
    module = ast.fix_missing_locations(ast.Module(body=[factory], type_ignores=[]))
    namespace: dict[str, Any] = {}
    exec(compile(module, inspect.getsourcefile(original) or "<upstream>", "exec"), original.__globals__, namespace)
    owner = original.__globals__.get(original.__qualname__.split(".")[0]) if "." in original.__qualname__ else None
    new: Callable[..., Any] = namespace["_factory"](owner)
    new.__defaults__, new.__kwdefaults__ = original.__defaults__, original.__kwdefaults__
    functools.update_wrapper(new, original)
    return new
