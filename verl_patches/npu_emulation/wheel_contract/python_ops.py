"""The training ops MindSpeed calls through torch_npu, as Python functions whose signature is the wheel's schema.

They stay Python functions on purpose: their plain-torch kernels are differentiable, so autograd gives the
backward the training numerics were recorded with, and MindSpeed's own autograd Functions call the emulated
backward ops directly. Each function is built from the wheel's registered schema (`wheel_function`): its
``__signature__`` is the schema's (names, order, defaults, keyword-only marks), it binds its arguments as the
real op does (an unknown keyword, a missing argument or one too many is a TypeError), passes them to the kernel
positionally (keyword-only ones by name), and checks the kernel's outputs against the wheel's Meta function where
the wheel has one (`registration.check_against_meta`).

vllm-ascend calls some of them (npu_rms_norm, npu_swiglu, npu_rotary_mul) inside its TorchAir graph, which dynamo
traces with ``fullgraph=True``: the binding is plain Python dynamo can follow (``inspect.Signature.bind`` is in a
module dynamo will not trace), and the Meta comparison, an eager check, is left out while compiling.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.npu_emulation.wheel_contract.contract import wheel_contract
from verl_patches.npu_emulation.wheel_contract.registration import check_against_meta, signature


def _binder(name: str, schema: torch._C.FunctionSchema) -> Callable[[tuple, dict], dict[str, Any]]:
    """(args, kwargs) -> every argument by its schema name, defaults filled; TypeError as Python's for a bad call."""
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    names = [a.name for a in schema.arguments]
    allowed = frozenset(names)
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}

    def bind(args: tuple, kwargs: dict) -> dict[str, Any]:
        if len(args) > len(positional):
            raise TypeError(f"{name}() takes {len(positional)} positional arguments but {len(args)} were given")
        named = dict(zip(positional, args))
        for key, value in kwargs.items():
            if key not in allowed:
                raise TypeError(f"{name}() got an unexpected keyword argument {key!r}")
            if key in named:
                raise TypeError(f"{name}() got multiple values for argument {key!r}")
            named[key] = value
        for key in names:
            if key not in named:
                if key not in defaults:
                    raise TypeError(f"{name}() missing a required argument: {key!r}")
                named[key] = defaults[key]
        return named

    return bind


def wheel_function(op: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` behind the signature the wheel registers for ``op`` ("npu::name[.overload]")."""
    contract = wheel_contract()
    schema = torch._C.parse_schema(contract.schema(op).text)
    name = schema.name.split("::")[-1]
    bind = _binder(name, schema)
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    keyword = [a.name for a in schema.arguments if a.kwarg_only]
    meta = contract.metas.get(op)
    source = contract.meta_sources.get(op, "")

    @functools.wraps(kernel)
    def function(*args: Any, **kwargs: Any) -> Any:
        named = bind(args, kwargs)
        pos = tuple(named[n] for n in positional)
        kw = {n: named[n] for n in keyword}
        out = kernel(*pos, **kw)
        if meta is not None and not torch.compiler.is_compiling():
            with torch.no_grad():
                check_against_meta(op, meta, source, pos, kw, out, named)
        return out

    function.__signature__ = signature(schema)  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = name
    function.__wrapped__ = kernel  # type: ignore[attr-defined]
    function.wheel_op = op  # type: ignore[attr-defined]
    return function
