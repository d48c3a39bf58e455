"""What the audit says about the emulation's contract, without torch or yaml (the audit runs before anything is
installed): the pinned wheel (file, sha256, whether the cache holds exactly it), and for each emulated op where its
schema and its Meta function come from in that wheel, or that the wheel has no Meta function for it.

The Meta functions are found by reading the wheel's registration files as syntax (``@impl(m, "name")`` over
``m = Library(ns, ...)``), not by running them.
"""

from __future__ import annotations

import ast
import io
import zipfile
from pathlib import Path

from verl_patches.npu_emulation.wheel_contract import archive
from verl_patches.npu_emulation.wheel_contract.fetch import WheelError, cached_wheel, wheel_bytes
from verl_patches.npu_emulation.wheel_contract.pin import TORCH_NPU_WHEEL

SCHEMA_SOURCES = {
    "npu": f"{archive.TORCH_NPU_LIBRARY} (its TORCH_LIBRARY(npu) text; {archive.NATIVE_FUNCTIONS_CODEGEN})",
    "atb": f"{archive.ATB_LIBRARY} (its TORCH_LIBRARY(atb) text; exposure: {archive.ATB_OPS})",
    "npu_inference": archive.TORCHAIR_CUSTOM_OPS,
}
META_FILES = (archive.META_REGISTRATIONS, archive.ATB_META_REGISTRATIONS, archive.TORCHAIR_CUSTOM_OPS)


def _libraries(tree: ast.Module) -> dict[str, tuple[str, str]]:
    """Variable -> (namespace, dispatch key) for each ``x = Library(ns, kind[, key])`` of a file."""
    found = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "id", None) == "Library"
        ):
            args = [a.value for a in node.value.args if isinstance(a, ast.Constant)]
            found[node.targets[0].id] = (args[0], args[2] if len(args) > 2 else "")
    return found


def meta_functions_in(source: str, member: str) -> set[str]:
    """ "ns::name[.overload]" of every function the file decorates with ``@impl(lib, "name"[, "Meta"])`` for the
    Meta key (read as syntax; nothing runs)."""
    tree = ast.parse(source, member)
    libraries = _libraries(tree)
    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for deco in node.decorator_list:
            if not (isinstance(deco, ast.Call) and getattr(deco.func, "id", None) == "impl" and len(deco.args) >= 2):
                continue
            lib, name = deco.args[0], deco.args[1]
            if not (isinstance(lib, ast.Name) and lib.id in libraries and isinstance(name, ast.Constant)):
                continue
            namespace, key = libraries[lib.id]
            if len(deco.args) > 2 and isinstance(deco.args[2], ast.Constant):
                key = deco.args[2].value
            if key == "Meta":
                found.add(f"{namespace}::{name.value}")
    return found


def wheel_summary(cache: Path | None = None) -> dict:
    """The pin and whether the cache holds exactly that file; with it, where each Meta function lives."""
    pin = TORCH_NPU_WHEEL
    out: dict = {"file": pin.file, "sha256": pin.sha256, "url": pin.url, "path": str(cached_wheel(pin, cache))}
    try:
        data = wheel_bytes(pin, cache)
    except WheelError as err:
        out.update(status="not usable", detail=str(err), metas={})
        return out
    metas: dict[str, str] = {}
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        for member in META_FILES:
            for op in meta_functions_in(z.read(member).decode("utf-8"), member):
                metas.setdefault(op, member)
    out.update(status="verified", detail="", metas=metas)
    return out


def op_sources(op: str, summary: dict) -> dict:
    """Where ``op``'s schema and Meta function come from ("ns::name[.overload]")."""
    namespace = op.split("::", 1)[0]
    meta = summary["metas"].get(op)
    if summary["status"] != "verified":
        meta_text = f"unknown: {summary['detail']}"
    elif meta is None:
        meta_text = "NONE in the wheel: sized by the emulation (its fake; a Python function is traced through)"
    else:
        meta_text = meta
    return {"op": op, "schema": SCHEMA_SOURCES.get(namespace, "?"), "meta": meta_text, "has_wheel_meta": bool(meta)}
