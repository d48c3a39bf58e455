"""Lazy access to a sharded safetensors checkpoint (an HF model directory).

``CheckpointIndex`` maps tensor names to shard files (from ``model.safetensors.index.json``, or from the
shards' headers when there is no index). ``LazyCheckpoint`` opens shards on demand with
``safetensors.safe_open`` (memory-mapped) and reads whole tensors or row/column ranges of them, so a
converter touches only the bytes it needs.

Resident memory: with safetensors >= 0.6 a tensor or slice is a zero-copy view of the mapping, and every
page touched in a mapped shard counts towards the process's RSS until the mapping is released (the handle
closed and no view alive). So at most ``max_open`` shards stay mapped, and all handles are dropped after
every ``remap_bytes`` read: the RSS due to mapped pages stays below about ``remap_bytes`` plus the
tensors still referenced.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from verl_patches.weights.errors import CheckpointError, MissingTensorError
from verl_patches.weights.hf_dir import INDEX_FILE
from verl_patches.weights.st_writer import TORCH_DTYPES

DEFAULT_REMAP_BYTES = 256 << 20


_SHARD_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*\.safetensors$")


def check_shard_name(fname: str, where: str) -> str:
    """A shard is a plain `*.safetensors` file name in the checkpoint folder: converters write an
    output shard of the same name, so '../x' or an absolute name would write outside the output folder
    (or over the input itself)."""
    if not _SHARD_NAME.match(fname):
        raise CheckpointError(
            f"{where}: shard name {fname!r} is not a plain '*.safetensors' file name in the checkpoint folder"
        )
    return fname


@dataclass
class CheckpointIndex:
    root: Path
    weight_map: dict[str, str]
    metadata: dict[str, Any] = field(default_factory=dict)
    has_index_file: bool = True

    @classmethod
    def load(cls, root: str | Path) -> CheckpointIndex:
        root = Path(root)
        if not root.is_dir():
            raise CheckpointError(f"{root}: checkpoint directory not found")
        index_path = root / INDEX_FILE
        if index_path.is_file():
            try:
                data = json.loads(index_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise CheckpointError(f"{index_path}: line {err.lineno}: invalid JSON: {err.msg}") from None
            except (RecursionError, UnicodeDecodeError):
                raise CheckpointError(f"{index_path}: not UTF-8 JSON of a plausible depth") from None
            wm = data.get("weight_map") if isinstance(data, dict) else None
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise CheckpointError(f"{index_path}: key 'weight_map' must map tensor names to file names")
            for tensor, fname in wm.items():
                check_shard_name(fname, f"{index_path}: weight_map[{tensor!r}]")
            meta = data.get("metadata") or {}
            idx = cls(root, dict(wm), dict(meta) if isinstance(meta, dict) else {}, True)
        else:
            files = sorted(p.name for p in root.glob("*.safetensors"))
            if not files:
                raise CheckpointError(f"{root}: no {INDEX_FILE} and no *.safetensors files")
            wm = {}
            for name in files:
                for key in _header(root / name):
                    wm[key] = name
            idx = cls(root, wm, {}, False)
        for fname in idx.files():
            if not (root / fname).is_file():
                example = next(k for k, v in idx.weight_map.items() if v == fname)
                raise CheckpointError(
                    f"{root}: shard {fname!r} (holding e.g. {example!r}) listed in the index is missing"
                )
        return idx

    def files(self) -> list[str]:
        return sorted(set(self.weight_map.values()))

    def tensors_in(self, fname: str) -> list[str]:
        return [k for k, v in self.weight_map.items() if v == fname]

    def file_of(self, name: str) -> str:
        try:
            return self.weight_map[name]
        except KeyError:
            raise MissingTensorError(f"{self.root}: tensor {name!r} is not in the checkpoint") from None

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def fingerprint(self) -> str:
        """sha256 of the sorted name->file map: identifies the source of a resumable conversion."""
        blob = json.dumps(sorted(self.weight_map.items())).encode()
        return hashlib.sha256(blob).hexdigest()


def _header(path: Path) -> dict[str, dict[str, Any]]:
    """The JSON header of a safetensors file without mapping its data (dtype, shape per tensor)."""
    try:
        with open(path, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            if n <= 0 or n > 1 << 30:
                raise ValueError(f"implausible header length {n}")
            hdr = json.loads(f.read(n))
    except (OSError, ValueError, RecursionError) as err:
        raise CheckpointError(f"{path}: not a readable safetensors file ({err})") from None
    hdr.pop("__metadata__", None)
    return hdr


def read_header(path: str | Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """``{name: (dtype, shape)}`` of a safetensors file, from its header only."""
    out = {}
    for name, info in _header(Path(path)).items():
        code = info.get("dtype")
        if code not in TORCH_DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has unsupported dtype {code!r}")
        out[name] = (TORCH_DTYPES[code], tuple(info["shape"]))
    return out


class LazyCheckpoint:
    """Read tensors, or row/column ranges of them, from a checkpoint without loading whole shards."""

    def __init__(self, index: CheckpointIndex, max_open: int = 2, remap_bytes: int = DEFAULT_REMAP_BYTES):
        self.index = index
        self.max_open = max(1, max_open)
        self.remap_bytes = remap_bytes
        self._since_remap = 0
        self._open: OrderedDict[str, Any] = OrderedDict()
        self._headers: dict[str, dict[str, tuple[torch.dtype, tuple[int, ...]]]] = {}

    def __enter__(self) -> LazyCheckpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Unmap every open shard (dropping the handle releases the mapping once no view is alive)."""
        self._open.clear()
        self._since_remap = 0

    def _account(self, t: torch.Tensor) -> torch.Tensor:
        self._since_remap += t.numel() * t.element_size()
        if self._since_remap >= self.remap_bytes:
            self.close()
        return t

    def _handle(self, fname: str) -> Any:
        h = self._open.get(fname)
        if h is None:
            path = self.index.root / fname
            try:
                h = safe_open(str(path), framework="pt")
            except Exception as err:  # safetensors raises its own error types
                raise CheckpointError(f"{path}: cannot open as safetensors ({err})") from None
            self._open[fname] = h
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)
        else:
            self._open.move_to_end(fname)
        return h

    def header(self, fname: str) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
        if fname not in self._headers:
            self._headers[fname] = read_header(self.index.root / fname)
        return self._headers[fname]

    def info(self, name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        """(dtype, shape) of a tensor, from the shard header; names the shard if the index lies."""
        fname = self.index.file_of(name)
        hdr = self.header(fname)
        if name not in hdr:
            raise MissingTensorError(
                f"{self.index.root / fname}: tensor {name!r} listed in the index is not in this shard"
            )
        return hdr[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.info(name)[1]

    def dtype(self, name: str) -> torch.dtype:
        return self.info(name)[0]

    def get(self, name: str) -> torch.Tensor:
        self.info(name)
        return self._account(self._handle(self.index.file_of(name)).get_tensor(name))

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        self.info(name)
        return self._account(self._handle(self.index.file_of(name)).get_slice(name)[start:stop])

    def cols(self, name: str, start: int, stop: int) -> torch.Tensor:
        self.info(name)
        # a column range of a row-major tensor touches every row's pages
        t = self._handle(self.index.file_of(name)).get_slice(name)[:, start:stop]
        self._since_remap += t.numel() * t.element_size() * (self.shape(name)[1] // max(1, stop - start))
        if self._since_remap >= self.remap_bytes:
            self.close()
        return t
