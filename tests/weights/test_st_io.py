"""Streaming safetensors writer and lazy sharded reader."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from verl_patches.weights.errors import CheckpointError, MissingTensorError
from verl_patches.weights.file_digest import file_sha256
from verl_patches.weights.st_reader import CheckpointIndex, LazyCheckpoint
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file


def test_streamed_file_reads_back_with_safetensors(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {
        "bf16": torch.randn(5, 7, generator=g).bfloat16(),
        "f32": torch.randn(3, generator=g),
        "fp8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "scalar": torch.tensor(7, dtype=torch.int64),
        "empty": torch.zeros(0, 3),
        "i8": torch.arange(-3, 3, dtype=torch.int8),
    }
    specs = [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()]
    path = tmp_path / "x.safetensors"
    size, sha = write_safetensors_file(path, specs, lambda s: tensors[s.name])
    assert size == path.stat().st_size and sha == file_sha256(path)
    back = load_file(str(path))
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and torch.equal(
            back[k].view(torch.uint8) if v.dtype == torch.float8_e4m3fn else back[k],
            v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v,
        )


def test_writer_refuses_mismatches(tmp_path):
    specs = [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.float32, (3,))]
    with pytest.raises(ValueError, match="does not match the announced"):
        write_safetensors_file(tmp_path / "x", specs, lambda s: torch.zeros(2))


def test_lazy_rows_cols_and_index_errors(tmp_path):
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(10, 6, generator=g), torch.randn(4, 8, generator=g).bfloat16()
    save_file({"a": a}, str(tmp_path / "s1.safetensors"))
    save_file({"b": b}, str(tmp_path / "s2.safetensors"))
    idx = CheckpointIndex.load(tmp_path)  # no index file: built from the headers
    assert not idx.has_index_file and idx.weight_map == {"a": "s1.safetensors", "b": "s2.safetensors"}
    with LazyCheckpoint(idx) as ck:
        assert torch.equal(ck.rows("a", 2, 5), a[2:5]) and torch.equal(ck.cols("b", 3, 7), b[:, 3:7])
        assert ck.shape("b") == (4, 8) and ck.dtype("b") == torch.bfloat16
        with pytest.raises(MissingTensorError, match="'c' is not in the checkpoint"):
            ck.get("c")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "s1.safetensors", "z": "s3.safetensors"}})
    )
    with pytest.raises(CheckpointError, match="shard 's3.safetensors' \\(holding e.g. 'z'\\)"):
        CheckpointIndex.load(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{\n\n  nope")
    with pytest.raises(CheckpointError, match="line 3"):
        CheckpointIndex.load(tmp_path)


def test_mappings_are_released_after_remap_bytes(tmp_path):
    save_file({f"t{i}": torch.zeros(256, 256) for i in range(8)}, str(tmp_path / "s.safetensors"))  # 256 KiB each
    with LazyCheckpoint(CheckpointIndex.load(tmp_path), remap_bytes=600 << 10) as ck:
        ck.get("t0")
        ck.get("t1")
        assert len(ck._open) == 1
        ck.get("t2")  # 768 KiB read: every mapping is dropped
        assert len(ck._open) == 0
        ck.cols("t3", 0, 16)  # a column slice touches every row's pages: counts as the whole tensor
        ck.cols("t4", 0, 16)
        ck.cols("t5", 0, 16)
        assert len(ck._open) == 0
