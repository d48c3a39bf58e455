"""The pinned torch_npu wheel's contract, read once per process: every op schema it registers, every Meta function
it registers, where torch_npu exposes its ATB ops. Everything comes from the hash-checked wheel (`fetch`).

The ``npu::`` schemas are found in libtorch_npu.so (57 MB once unpacked: about a second to read); they are kept
in the user's cache as JSON named by the wheel's sha256 and the digest of the files that parse them, so a
process reads that small file instead. That folder is reached like the wheel's (`verl_patches.base.private_dir`)
and a file in it is read only when it is this account's and others cannot write it; otherwise the wheel is read.
Meta functions are always taken from the wheel's own files (`sandbox`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_json_atomically
from verl_patches.base.private_dir import PrivateDirError, file_not_ours, open_private_dir
from verl_patches.base.user_cache import user_cache_dir
from verl_patches.npu_emulation.wheel_contract import archive, sandbox, schemas
from verl_patches.npu_emulation.wheel_contract.fetch import ROOT_HINT, cached_wheel, wheel_bytes
from verl_patches.npu_emulation.wheel_contract.pin import TORCH_NPU_WHEEL

_PARSERS = (Path(schemas.__file__), Path(__file__))
PARSED = "npu_wheel_contract"  # the user cache's folder of parsed schemas
_CUSTOM_OP = re.compile(r"^torch_npu\.(\w+) = torch\.ops\.npu\.(?:\w+)$", re.MULTILINE)


@dataclass(frozen=True)
class WheelContract:
    file: str  # the wheel's file name
    sha256: str
    path: Path
    schemas: dict[str, schemas.WheelSchema]  # "ns::name[.overload]" -> the registered schema
    metas: dict[str, Callable[..., Any]]  # "ns::name[.overload]" -> the wheel's Meta function
    meta_sources: dict[str, str]  # "ns::name[.overload]" -> the wheel member it comes from
    side_effects: frozenset[str]  # ops the wheel marks has_side_effect
    atb_exposure: dict[str, str]  # ATB op -> "torch_npu" or "torch_npu.atb"
    npu_exposed: frozenset[str]  # the npu:: ops torch_npu exposes as torch_npu.<name> (utils/custom_ops.py)

    def exposed_as(self, qualified: str) -> str | None:
        """Where torch_npu puts the op's packet: "name" (torch_npu.name), "atb.name" (torch_npu.atb.name), or None."""
        namespace, rest = qualified.split("::", 1)
        if "." in rest:
            return None  # an overload is reached through its packet
        if namespace == "npu":
            return rest if rest in self.npu_exposed else None
        if namespace == "atb":
            where = self.atb_exposure.get(rest)
            return None if where is None else (rest if where == "torch_npu" else f"atb.{rest}")
        return None

    def schema(self, qualified: str) -> schemas.WheelSchema:
        try:
            return self.schemas[qualified]
        except KeyError:
            raise KeyError(f"{self.file}: registers no op {qualified}") from None


def _parser_digest() -> str:
    h = hashlib.sha256()
    for path in _PARSERS:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cache_name(sha256: str) -> str:
    return f"{sha256[:16]}-{_parser_digest()}.json"


def _read_parsed(fd: int, name: str) -> dict | None:
    """The parsed schemas cached as ``name`` in the checked folder ``fd``, or None (absent, unreadable, or a file
    this account does not own alone)."""
    try:
        handle = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except OSError:
        return None
    with os.fdopen(handle, "rb") as f:
        if file_not_ours(os.fstat(f.fileno())):
            return None
        try:
            return json.loads(f.read().decode("utf-8"))
        except ValueError:
            return None


def yaml_functions(wheel: archive.WheelArchive) -> dict[str, list[schemas.YamlFunc]]:
    import yaml  # lazy: only a first read (or a test) parses the yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    found: dict[str, list[schemas.YamlFunc]] = {}
    for member in (archive.NATIVE_FUNCTIONS_CODEGEN, archive.NATIVE_FUNCTIONS):
        for key, funcs in schemas.yaml_functions(yaml.load(wheel.data(member), Loader=loader), member).items():
            found.setdefault(key, []).extend(funcs)
    return found


def _npu_schemas(wheel: archive.WheelArchive, sha256: str) -> dict[str, schemas.WheelSchema]:
    name = _cache_name(sha256)
    try:
        fd, folder = open_private_dir(user_cache_dir(), (PARSED,), root_hint=ROOT_HINT)
    except PrivateDirError:
        fd, folder = -1, None  # a folder others could change: nothing is read from it or written to it
    try:
        rows = _read_parsed(fd, name) if fd >= 0 else None
        if rows is not None:
            try:
                return {key: schemas.WheelSchema(**row) for key, row in rows.items()}
            except TypeError:
                pass  # not the layout this parser writes: read the wheel again
        names = frozenset(key.split(".", 1)[0] for key in yaml_functions(wheel))
        library = wheel.data(archive.TORCH_NPU_LIBRARY)
        found = schemas.library_schemas(library, names, "npu", archive.TORCH_NPU_LIBRARY)
        if folder is not None:
            try:
                write_json_atomically(folder / name, {key: vars(s) for key, s in found.items()}, indent=None)
            except OSError:
                pass  # a read-only cache: every process reads the wheel
        return found
    finally:
        if fd >= 0:
            os.close(fd)


def read_contract(data: bytes, path: Path, sha256: str) -> WheelContract:
    """The contract of the wheel ``data`` (already checked to hash to ``sha256``), cached at ``path``."""
    wheel = archive.WheelArchive(data, path.name)
    atb_exposure = schemas.atb_exposure(wheel.text(archive.ATB_OPS), archive.ATB_OPS)
    found: dict[str, schemas.WheelSchema] = {}
    for key, s in _npu_schemas(wheel, sha256).items():
        found[f"npu::{key}"] = s
    atb_names = frozenset(atb_exposure)
    for key, s in schemas.library_schemas(
        wheel.data(archive.ATB_LIBRARY), atb_names, "atb", archive.ATB_LIBRARY
    ).items():
        found[f"atb::{key}"] = s
    metas: dict[str, Callable[..., Any]] = {}
    meta_sources: dict[str, str] = {}
    side_effects: set[str] = set()
    for member in (archive.META_REGISTRATIONS, archive.ATB_META_REGISTRATIONS, archive.TORCHAIR_CUSTOM_OPS):
        capture = sandbox.run_registrations(wheel.text(member), member)
        for key, fn in capture.metas.items():
            metas[key] = fn
            meta_sources[key] = member
        side_effects |= capture.side_effects
        for key, text in capture.defines.items():
            ns, rest = key.split("::", 1)
            name, _, overload = rest.partition(".")
            found[key] = schemas.WheelSchema(ns, name, overload, text, member)
    npu_exposed = frozenset(_CUSTOM_OP.findall(wheel.text(archive.CUSTOM_OPS)))
    return WheelContract(
        file=path.name,
        sha256=sha256,
        path=path,
        schemas=found,
        metas=metas,
        meta_sources=meta_sources,
        side_effects=frozenset(side_effects),
        atb_exposure=atb_exposure,
        npu_exposed=npu_exposed,
    )


@functools.lru_cache(maxsize=1)
def wheel_contract() -> WheelContract:
    """The pinned wheel's contract (raises fetch.WheelError when the wheel is not in the cache or not the pinned
    file); read once per process."""
    return read_contract(wheel_bytes(), cached_wheel(), TORCH_NPU_WHEEL.sha256)
