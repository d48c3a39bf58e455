"""Register the emulated ops as dispatcher ops that keep the real torch_npu's contract by construction.

For each `Emulated` entry the op is defined with the schema the pinned wheel registers (`contract`), as the wheel
writes it, changed only by a declared `deviations.Mutation` (alias marks the wheel's text lacks, with the reason).
Its kernels:

* CompositeExplicitAutograd (every device): the documented limits (`limits.check`) on the arguments bound by the
  schema's names, then the plain-torch kernel, then the wheel's Meta function run on meta copies of the inputs
  and compared with the kernel's outputs, shape and dtype (a kernel that answers differently from the real op's
  Meta function fails at once, naming the output);
* Meta: the wheel's own Meta function where the wheel has one, so tracing (dynamo, FakeTensor) sizes the op as
  torch_npu does; otherwise the emulation's fake, registered with ``register_fake`` and listed by the audit as
  "no Meta in the wheel";
* ops the wheel marks ``has_side_effect`` are marked so here (a traced graph keeps them).

`register` defines what is not yet defined in this process (a second call only looks the ops up) and returns
every op packet by the name torch_npu exposes it under.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from verl_patches.npu_emulation.wheel_contract import limits
from verl_patches.npu_emulation.wheel_contract.contract import WheelContract, wheel_contract
from verl_patches.npu_emulation.wheel_contract.deviations import META_DISAGREEMENTS, MUTATIONS, Mutation


@dataclass(frozen=True)
class Emulated:
    op: str  # "ns::name[.overload]", as the wheel registers it
    kernel: Callable[..., Any]
    fallback_fake: Callable[..., Any] | None = None  # only for an op the wheel has no Meta function for

    @property
    def namespace(self) -> str:
        return self.op.split("::", 1)[0]

    @property
    def name(self) -> str:
        return self.op.split("::", 1)[1].split(".", 1)[0]

    @property
    def overload(self) -> str:
        rest = self.op.split("::", 1)[1]
        return rest.split(".", 1)[1] if "." in rest else ""

    @property
    def qualname(self) -> str:
        return self.name + (f".{self.overload}" if self.overload else "")


class MetaMismatch(RuntimeError):
    """The emulated kernel's outputs are not shaped as the wheel's Meta function says the real op's are."""


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        parts.append(current.strip())
    return parts


def schema_text(wheel_text: str, mutation: Mutation | None) -> str:
    """The wheel's schema text, with ``mutation``'s alias marks added (unchanged without one)."""
    text = " ".join(wheel_text.split())
    if mutation is None:
        return text
    head, rest = text.split("(", 1)
    arguments, returns = rest.rsplit(") -> ", 1)
    args = _split_top(arguments)
    for name, alias in mutation.arguments.items():
        hits = [i for i, a in enumerate(args) if re.fullmatch(rf"Tensor {re.escape(name)}", a)]
        if len(hits) != 1:
            raise ValueError(f"{head}: no unmarked argument 'Tensor {name}' in the wheel's schema to mark")
        args[hits[0]] = f"Tensor({alias}!) {name}"
    outs = _split_top(returns[1:-1]) if returns.startswith("(") else [returns]
    for index, alias in mutation.returns.items():
        if outs[index] != "Tensor":
            raise ValueError(f"{head}: return {index} is {outs[index]!r}, not an unmarked Tensor")
        outs[index] = f"Tensor({alias}!)"
    ret = f"({', '.join(outs)})" if returns.startswith("(") else outs[0]
    return f"{head}({', '.join(args)}) -> {ret}"


def signature(schema: torch._C.FunctionSchema) -> inspect.Signature:
    """The Python signature a schema gives an op: names, order, defaults, keyword-only marks."""
    params = []
    for a in schema.arguments:
        kind = inspect.Parameter.KEYWORD_ONLY if a.kwarg_only else inspect.Parameter.POSITIONAL_OR_KEYWORD
        default = a.default_value if a.has_default_value() else inspect.Parameter.empty
        params.append(inspect.Parameter(a.name, kind, default=default))
    return inspect.Signature(params)


def _to_meta(x: Any) -> Any:
    return x.to("meta") if isinstance(x, torch.Tensor) else x


def _tensor_leaves(value: Any) -> list[Any]:
    return [leaf for leaf in pytree.tree_leaves(value) if leaf is not None]


def check_against_meta(
    op: str,
    meta: Callable[..., Any],
    source: str,
    args: tuple,
    kwargs: dict,
    out: Any,
    named: Mapping[str, Any] | None = None,
) -> None:
    """MetaMismatch unless ``out`` has the shapes and dtypes ``meta`` gives for meta copies of the inputs (but the
    outputs a declared `deviations.MetaDisagreement` names for these arguments, ``named`` by the schema)."""
    expected = meta(*pytree.tree_map(_to_meta, args), **pytree.tree_map(_to_meta, kwargs))
    want, got = _tensor_leaves(expected), _tensor_leaves(out)
    if len(want) != len(got):
        raise MetaMismatch(
            f"{op}: the emulated kernel returned {len(got)} outputs, the wheel's Meta ({source}) {len(want)}"
        )
    disagreement = META_DISAGREEMENTS.get(op)
    skip: tuple[int, ...] = ()
    if disagreement is not None and named is not None and named.get(disagreement.argument) in disagreement.values:
        skip = disagreement.outputs
    for i, (w, g) in enumerate(zip(want, got)):
        if not isinstance(w, torch.Tensor) or i in skip:
            continue  # a scalar output (npu_fusion_attention's seed, offset, numels), or a declared disagreement
        if not isinstance(g, torch.Tensor) or tuple(g.shape) != tuple(w.shape) or g.dtype != w.dtype:
            shown = f"{tuple(g.shape)} {g.dtype}" if isinstance(g, torch.Tensor) else repr(g)
            raise MetaMismatch(
                f"{op}: output {i} of the emulated kernel is {shown}; the wheel's Meta function ({source}) gives "
                f"{tuple(w.shape)} {w.dtype} for these inputs"
            )


def _eager_kernel(entry: Emulated, sig: inspect.Signature, meta: Callable | None, source: str) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        limits.check(entry.op, bound.arguments)
        out = entry.kernel(*args, **kwargs)
        if meta is not None:
            with torch.no_grad():
                check_against_meta(entry.op, meta, source, args, kwargs, out, bound.arguments)
        return out

    kernel.__name__ = f"emulated_{entry.name}"
    return kernel


def _aliasing_meta(meta: Callable[..., Any], schema: torch._C.FunctionSchema) -> Callable[..., Any]:
    """The wheel's Meta function, returning the input itself for each output the schema marks as its alias."""
    aliased = {}
    for i, ret in enumerate(schema.returns):
        if ret.alias_info is not None:
            source = [
                a.name
                for a in schema.arguments
                if a.alias_info and a.alias_info.before_set == ret.alias_info.before_set
            ]
            aliased[i] = source[0]
    if not aliased:
        return meta
    sig = signature(schema)

    def meta_with_aliases(*args: Any, **kwargs: Any) -> Any:
        out = list(meta(*args, **kwargs))
        bound = sig.bind(*args, **kwargs)
        for i, name in aliased.items():
            arg = bound.arguments[name]
            if tuple(out[i].shape) != tuple(arg.shape) or out[i].dtype != arg.dtype:
                raise MetaMismatch(f"{schema.name}: the wheel's Meta output {i} is not shaped as {name}")
            out[i] = arg
        return tuple(out)

    return meta_with_aliases


_LIBRARIES: dict[str, torch.library.Library] = {}  # kept alive: a collected Library takes its registrations along
# "ns::name[.overload]" -> what its Meta kernel is in this process: the wheel's Meta function, or the emulation's
# fallback fake (the audit and the tests read it)
META_KERNELS: dict[str, Callable[..., Any]] = {}


@dataclass
class Registered:
    packets: dict[str, Any] = field(default_factory=dict)  # where torch_npu exposes it ("name", "atb.name") -> packet


def _defined(entry: Emulated) -> bool:
    return any(
        s.overload_name == entry.overload
        for s in torch._C._jit_get_schemas_for_operator(f"{entry.namespace}::{entry.name}")
    )


def define(entry: Emulated, contract: WheelContract) -> None:
    wheel = contract.schema(entry.op)
    text = schema_text(wheel.text, MUTATIONS.get(entry.op))
    lib = _LIBRARIES.get(entry.namespace)
    if lib is None:
        # FRAGMENT: the npu device and other emulated ops add to the same namespaces
        lib = _LIBRARIES[entry.namespace] = torch.library.Library(entry.namespace, "FRAGMENT")
    lib.define(text)
    schema = torch._C.parse_schema(text)
    meta = contract.metas.get(entry.op)
    source = contract.meta_sources.get(entry.op, "")
    _check_kernel_accepts(entry, schema)
    lib.impl(entry.qualname, _eager_kernel(entry, signature(schema), meta, source), "CompositeExplicitAutograd")
    if meta is not None:
        lib.impl(entry.qualname, _aliasing_meta(meta, schema), "Meta")
        META_KERNELS[entry.op] = meta
    elif entry.fallback_fake is not None:
        torch.library.register_fake(entry.op, entry.fallback_fake, lib=lib)
        META_KERNELS[entry.op] = entry.fallback_fake
    else:
        raise ValueError(f"{entry.op}: the wheel has no Meta function for it and the emulation gives no fake")
    if entry.op in contract.side_effects:
        from torch.fx.node import has_side_effect  # lazy: only ops the wheel marks need it

        packet = getattr(getattr(torch.ops, entry.namespace), entry.name)
        has_side_effect(getattr(packet, entry.overload or "default"))


def _check_kernel_accepts(entry: Emulated, schema: torch._C.FunctionSchema) -> None:
    """The dispatcher passes keyword-only arguments by name: the kernel must take each of them."""
    params = inspect.signature(entry.kernel).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    missing = [a.name for a in schema.arguments if a.kwarg_only and a.name not in params]
    if missing:
        raise TypeError(f"{entry.op}: the emulated kernel takes no keyword argument {missing} of the wheel's schema")


def register(entries: Iterable[Emulated]) -> Registered:
    """Define every entry not yet defined in this process; the op packets by the names the wheel's torch_npu
    exposes them under (`WheelContract.exposed_as`: ops it does not expose are reached as torch.ops.<ns>.<name>)."""
    contract = wheel_contract()
    registered = Registered()
    for entry in entries:
        if not _defined(entry):
            define(entry, contract)
        where = contract.exposed_as(entry.op)
        if where is not None:
            registered.packets[where] = getattr(getattr(torch.ops, entry.namespace), entry.name)
    return registered
