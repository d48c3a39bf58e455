"""Run the wheel's Meta-registration files so that their registrations are captured, not made.

torch_npu registers its Meta functions (`op_plugin/meta/_meta_registrations.py`, `op_plugin/atb/
_atb_meta_registrations.py`) and TorchAir its ``npu_inference`` ops (`_contrib/custom_torch_ops/
auto_register_custom_torch_ops.py`) with ``torch.library``: plain Python, ``m = Library(ns, kind[, key])``,
``m.define(schema)`` and ``@impl(m, "name"[, key])`` over ordinary functions. Here the file's statements run in a
namespace of their own where those names are stand-ins that record what the file defines and capture each
decorated function unchanged; ``torch`` and ``math`` are the real modules (the functions compute with them, and
version tests such as ``if torch.__version__ >= "2.3.1"`` decide as they do under torch_npu with this torch).

Why running the wheel's code is safe here: the file comes from the wheel bytes whose sha256 `fetch.wheel_bytes`
checked against the pin (`pin.py`) before anything is read, it is executed with only the imports listed in
`_ALLOWED_IMPORTS` (any other import fails, naming it), and it registers nothing by itself. Top-level
``has_side_effect(torch.ops.<ns>.<op>.<overload>)`` calls are recorded, not run (they name ops this process may not
have defined yet); the registration applies them (`registration`).
"""

from __future__ import annotations

import ast
import builtins
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Capture:
    source: str  # the wheel member that was run
    metas: dict[str, Callable[..., Any]] = field(default_factory=dict)  # "ns::name[.overload]" -> Meta function
    defines: dict[str, str] = field(default_factory=dict)  # "ns::name[.overload]" -> schema text (DEF libraries)
    side_effects: set[str] = field(default_factory=set)  # "ns::name[.overload]" marked has_side_effect
    other_kernels: dict[str, str] = field(default_factory=dict)  # "ns::name" -> dispatch key, not captured


class _Code:
    def __init__(self, name: str) -> None:
        self.name = name


class _ErrCodes:
    """torch_npu.utils._error_code.ErrCode as the Meta functions use it: ``ErrCode.VALUE`` and the like."""

    def __getattr__(self, name: str) -> _Code:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Code(name)


def _ops_error(code: _Code) -> str:
    return f" [torch_npu OPS error: {code.name}]"


def _qualified(namespace: str, name: str) -> str:
    return name if "::" in name else f"{namespace}::{name}"


def _torch_library_stub(capture: Capture) -> types.ModuleType:
    class Library:
        def __init__(self, ns: str, kind: str, dispatch_key: str = "") -> None:
            self.ns, self.kind, self.dispatch_key = ns, kind, dispatch_key

        def define(self, schema: str, *args: Any, **kwargs: Any) -> str:
            text = " ".join(schema.split())
            key = text.split("(", 1)[0]
            capture.defines[_qualified(self.ns, key)] = text
            return key

    def impl(lib: Library, name: str, dispatch_key: str = "") -> Callable[[Callable], Callable]:
        key = dispatch_key or lib.dispatch_key

        def capture_function(fn: Callable) -> Callable:
            if key == "Meta":
                capture.metas[_qualified(lib.ns, name)] = fn
            else:
                capture.other_kernels[_qualified(lib.ns, name)] = key
            return fn

        return capture_function

    module = types.ModuleType("torch.library (captured)")
    module.Library, module.impl = Library, impl
    return module


def _side_effect_target(node: ast.stmt) -> str | None:
    """``has_side_effect(torch.ops.ns.name.overload)`` as a top-level statement -> "ns::name[.overload]"."""
    if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)):
        return None
    call = node.value
    if not (isinstance(call.func, ast.Name) and call.func.id == "has_side_effect" and len(call.args) == 1):
        return None
    parts = ast.unparse(call.args[0]).split(".")
    if parts[:2] != ["torch", "ops"] or len(parts) not in (4, 5):
        raise ValueError(f"has_side_effect({ast.unparse(call.args[0])}): not torch.ops.<ns>.<op>[.<overload>]")
    overload = parts[4] if len(parts) == 5 and parts[4] != "default" else ""
    return f"{parts[2]}::{parts[3]}" + (f".{overload}" if overload else "")


def run_registrations(source_text: str, source: str) -> Capture:
    """Execute a registration file's statements with the capturing stand-ins; what it registers, captured."""
    capture = Capture(source)
    modules: dict[str, Any] = {
        "math": math,
        "typing": typing,
        "torch.library": _torch_library_stub(capture),
        "torch.fx.node": types.SimpleNamespace(has_side_effect=lambda op: None),
        "torch_npu.utils._error_code": types.SimpleNamespace(ErrCode=_ErrCodes(), ops_error=_ops_error),
    }

    def guarded_import(name: str, globals_: Any = None, locals_: Any = None, fromlist: Any = (), level: int = 0):
        if level or name not in _ALLOWED_IMPORTS:
            raise ImportError(
                f"{source}: import of {name!r} is not one the sandbox provides ({sorted(_ALLOWED_IMPORTS)})"
            )
        if name == "torch":
            import torch  # lazy: the Meta functions compute with the real torch, loaded by then anyway

            return torch
        return modules[name]

    tree = ast.parse(source_text, source)
    body = []
    for node in tree.body:
        target = _side_effect_target(node)
        if target is None:
            body.append(node)
        else:
            capture.side_effects.add(target)
    tree.body = body
    namespace: dict[str, Any] = {
        "__name__": f"verl_patches.wheel_contract.sandbox:{source}",
        "__builtins__": {**vars(builtins), "__import__": guarded_import},
    }
    exec(compile(tree, source, "exec"), namespace)  # noqa: S102  (the hash-pinned wheel's file; see the docstring)
    return capture


_ALLOWED_IMPORTS = frozenset(
    {"math", "typing", "torch", "torch.library", "torch.fx.node", "torch_npu.utils._error_code"}
)
