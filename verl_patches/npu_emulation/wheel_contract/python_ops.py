"""The training ops MindSpeed calls through torch_npu, as Python functions whose signature is the wheel's schema.

They stay Python functions on purpose: their plain-torch kernels are differentiable, so autograd gives the
backward the training numerics were recorded with, and MindSpeed's own autograd Functions call the emulated
backward ops directly. Each function is built from the wheel's registered schema (`wheel_function`): its
``__signature__`` is the schema's (names, order, defaults, keyword-only marks), it binds its arguments as the
real op does (an unknown keyword or a missing argument is a TypeError), passes them to the kernel positionally
(keyword-only ones by name), and checks the kernel's outputs against the wheel's Meta function where the wheel
has one (`registration.check_against_meta`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.npu_emulation.wheel_contract.contract import wheel_contract
from verl_patches.npu_emulation.wheel_contract.registration import check_against_meta, signature


def wheel_function(op: str, kernel: Callable[..., Any]) -> Callable[..., Any]:
    """``kernel`` behind the signature the wheel registers for ``op`` ("npu::name[.overload]")."""
    contract = wheel_contract()
    schema = torch._C.parse_schema(contract.schema(op).text)
    sig = signature(schema)
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    keyword = [a.name for a in schema.arguments if a.kwarg_only]
    meta = contract.metas.get(op)
    source = contract.meta_sources.get(op, "")

    @functools.wraps(kernel)
    def function(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        pos = tuple(bound.arguments[n] for n in positional)
        kw = {n: bound.arguments[n] for n in keyword}
        out = kernel(*pos, **kw)
        if meta is not None:
            with torch.no_grad():
                check_against_meta(op, meta, source, pos, kw, out, bound.arguments)
        return out

    function.__signature__ = sig  # type: ignore[attr-defined]
    function.__name__ = function.__qualname__ = schema.name.split("::")[-1]
    function.__wrapped__ = kernel  # type: ignore[attr-defined]
    function.wheel_op = op  # type: ignore[attr-defined]
    return function
