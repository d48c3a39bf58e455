"""Write a safetensors file one tensor at a time, hashing it on the way.

``safetensors.torch.save_file`` needs every tensor of a file in memory at once; a DeepSeek-V3 shard is
several GB. The format is simple (8-byte little-endian header length, a JSON header of
``{name: {dtype, shape, data_offsets}}``, then the tensors' bytes back to back), so when the shapes and
dtypes are known up front the header can be written first and each tensor streamed after it: peak memory
is one tensor. Files are read back with the ``safetensors`` library in the tests.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import BinaryIO, NamedTuple

import torch

ST_DTYPES: dict[torch.dtype, str] = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.bool: "BOOL",
}
TORCH_DTYPES: dict[str, torch.dtype] = {v: k for k, v in ST_DTYPES.items()}


def dtype_nbytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


class TensorSpec(NamedTuple):
    """Name, dtype and shape of one tensor to be written."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * dtype_nbytes(self.dtype)


class StreamingSafetensorsWriter:
    """Write ``specs`` in order to an open binary file; ``add`` each tensor, then ``finish``."""

    def __init__(self, f: BinaryIO, specs: Sequence[TensorSpec], metadata: Mapping[str, str] | None = None):
        self._f = f
        self._specs = list(specs)
        self._next = 0
        self._hash = hashlib.sha256()
        self.size = 0
        header: dict[str, object] = {"__metadata__": dict(metadata or {"format": "pt"})}
        offset = 0
        for spec in self._specs:
            if spec.dtype not in ST_DTYPES:
                raise ValueError(f"tensor {spec.name!r}: dtype {spec.dtype} has no safetensors code")
            header[spec.name] = {
                "dtype": ST_DTYPES[spec.dtype],
                "shape": list(spec.shape),
                "data_offsets": [offset, offset + spec.nbytes],
            }
            offset += spec.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)  # the data section starts 8-byte aligned
        self._emit(struct.pack("<Q", len(raw)) + raw)

    def _emit(self, data: bytes | memoryview) -> None:
        self._f.write(data)
        self._hash.update(data)
        self.size += len(data)

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if self._next >= len(self._specs):
            raise ValueError(f"tensor {name!r}: more tensors than announced in the header")
        spec = self._specs[self._next]
        if name != spec.name or tensor.dtype != spec.dtype or tuple(tensor.shape) != spec.shape:
            raise ValueError(
                f"tensor {name!r} {tensor.dtype} {tuple(tensor.shape)} does not match the announced "
                f"{spec.name!r} {spec.dtype} {spec.shape}"
            )
        flat = tensor.detach().contiguous().reshape(-1)
        if flat.numel():
            self._emit(memoryview(flat.view(torch.uint8).numpy()))
        self._next += 1

    def finish(self) -> str:
        """Check that every announced tensor was written; return the file's sha256."""
        if self._next != len(self._specs):
            raise ValueError(
                f"only {self._next} of {len(self._specs)} announced tensors were written "
                f"(next: {self._specs[self._next].name!r})"
            )
        return self._hash.hexdigest()


def write_safetensors_file(
    path: Path,
    specs: Sequence[TensorSpec],
    produce: Callable[[TensorSpec], torch.Tensor],
    metadata: Mapping[str, str] | None = None,
) -> tuple[int, str]:
    """Stream ``produce(spec) -> Tensor`` for each spec into ``path``; return ``(size, sha256)``."""
    with open(path, "wb") as f:
        w = StreamingSafetensorsWriter(f, specs, metadata)
        for spec in specs:
            w.add(spec.name, produce(spec))
        digest = w.finish()
    return w.size, digest
