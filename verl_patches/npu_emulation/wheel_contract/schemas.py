"""The op schemas the pinned torch_npu wheel registers, read from the wheel's own files.

* ``npu::`` ops: the schema strings libtorch_npu.so hands to ``TORCH_LIBRARY(npu, m)`` (what ``torch.ops.npu`` has on
  A3), found among the library's NUL-terminated strings by the op names of the wheel's
  ``npu_native_functions_by_codegen.yaml``. The yaml's text is kept beside each for comparison: the two differ
  only where torch_npu's code generator rewrites it (an argument ``self`` is registered as ``input``; an out
  overload with several outs takes one ``Tensor[] out``), which `yaml_differences` names.
* ``atb::`` ops: the strings libop_plugin_atb.so registers, for the names ``_atb_ops.py`` lists.
* ``npu_inference::`` ops: TorchAir's ``m.define(...)`` texts, captured when `sandbox` runs that file.

Pure functions over bytes and text; `contract` reads the files and caches the result per process.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

_HEAD = re.compile(rb"([A-Za-z0-9_]+)(?:\.([A-Za-z0-9_]+))?$")  # name[.overload] just before the first "("
_ARROW = b") -> "


@dataclass(frozen=True)
class WheelSchema:
    namespace: str
    name: str
    overload: str  # "" for the default overload
    text: str  # as the wheel writes it
    source: str  # the wheel member it was read from

    @property
    def qualified(self) -> str:
        return f"{self.namespace}::{self.name}" + (f".{self.overload}" if self.overload else "")


def overload_key(name: str, overload: str) -> str:
    return name + (f".{overload}" if overload else "")


def library_schemas(binary: bytes, names: frozenset[str], namespace: str, source: str) -> dict[str, WheelSchema]:
    """ "name[.overload]" -> schema, for every schema string in ``binary`` whose op name is in ``names``.

    A compiled library keeps each ``m.def("...")`` text as a NUL-terminated string; a string may follow other
    bytes without a NUL between them, so the schema is taken from the first position in the string where one of
    ``names`` starts the ``name[.overload]`` that ends at its first ``(``."""
    found: dict[str, WheelSchema] = {}
    pos = 0
    while (arrow := binary.find(_ARROW, pos)) >= 0:
        start = binary.rfind(b"\0", 0, arrow) + 1
        end = binary.find(b"\0", arrow)
        end = len(binary) if end < 0 else end
        pos = end
        chunk = binary[start:end]
        paren = chunk.find(b"(")
        head = _HEAD.search(chunk, 0, paren) if paren > 0 else None
        if head is None:
            continue
        name, overload = head.group(1).decode(), (head.group(2) or b"").decode()
        # the string may start with bytes that are not its own (no NUL between): the name is a suffix of `name`
        first = next((j for j in range(len(name)) if name[j:] in names), None)
        if first is None:
            continue
        name = name[first:]
        try:
            text = chunk[head.start(1) + first :].decode("ascii")
        except UnicodeDecodeError:
            continue
        key = overload_key(name, overload)
        if key in found and found[key].text != text:
            raise ValueError(f"{source}: two different schemas for {namespace}::{key}")
        found[key] = WheelSchema(namespace, name, overload, text, source)
    return found


@dataclass(frozen=True)
class YamlFunc:
    section: str  # custom, autograd, symint, quant, supported...
    text: str
    exposed: bool


def yaml_functions(document: dict, source: str) -> dict[str, list[YamlFunc]]:
    """ "name[.overload]" -> every ``func:`` entry of a native-functions yaml (parsed), with its section."""
    out: dict[str, list[YamlFunc]] = {}
    for section, entries in document.items():
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if not isinstance(entry, dict) or "func" not in entry:
                continue
            text = " ".join(str(entry["func"]).split())
            key = text.split("(", 1)[0]
            out.setdefault(key, []).append(YamlFunc(section, text, bool(entry.get("exposed", False))))
    if not out:
        raise ValueError(f"{source}: no func entries")
    return out


def atb_exposure(atb_ops_source: str, source: str) -> dict[str, str]:
    """ATB op name -> where torch_npu exposes it: "torch_npu" (``API_LIST``) or "torch_npu.atb" (``ATB_API_LIST``),
    from the two lists in ``_atb_ops.py`` (read as data, never executed)."""
    lists: dict[str, list[str]] = {}
    for node in ast.parse(atb_ops_source, source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in ("API_LIST", "ATB_API_LIST"):
                lists[node.targets[0].id] = list(ast.literal_eval(node.value))
    if set(lists) != {"API_LIST", "ATB_API_LIST"}:
        raise ValueError(f"{source}: API_LIST / ATB_API_LIST not found")
    out = {name: "torch_npu" for name in lists["API_LIST"]}
    out.update({name: "torch_npu.atb" for name in lists["ATB_API_LIST"]})
    return out


def yaml_differences(registered: str, yaml_text: str) -> list[str]:
    """How the registered schema differs from the yaml's, each difference named; [] when they are the same
    after the code generator's two rewrites (``self`` -> ``input``; several outs -> ``Tensor[] out``)."""
    import torch  # lazy: parsing a schema needs torch; the rest of this module does not

    reg, yml = torch._C.parse_schema(registered), torch._C.parse_schema(yaml_text)
    notes = []
    yargs = list(yml.arguments)
    if (
        yml.overload_name == "out"
        and sum(1 for a in yargs if a.alias_info and a.alias_info.is_write and a.kwarg_only) > 1
    ):
        yargs = [a for a in yargs if not (a.alias_info and a.alias_info.is_write and a.kwarg_only)]
        rargs = [a for a in reg.arguments if a.name != "out"]
    else:
        rargs = list(reg.arguments)
    if len(rargs) != len(yargs):
        return [f"{len(reg.arguments)} arguments registered, {len(yml.arguments)} in the yaml"]
    for r, y in zip(rargs, yargs):
        if r.name != y.name and not (y.name == "self" and r.name == "input"):
            notes.append(f"argument {y.name} is registered as {r.name}")
        if str(r.type) != str(y.type):
            notes.append(f"{y.name}: type {y.type} registered as {r.type}")
        if r.kwarg_only != y.kwarg_only:
            notes.append(f"{y.name}: keyword-only {y.kwarg_only} registered as {r.kwarg_only}")
        if repr(r.default_value) != repr(y.default_value):
            notes.append(f"{y.name}: default {y.default_value!r} registered as {r.default_value!r}")
    return notes
