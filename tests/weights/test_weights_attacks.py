"""Attacks on the weight tools through a crafted input checkpoint (issue 18): shard names from the index
that leave the output folder or name the input itself, and tokenizer files that are symlinks out."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from verl_patches.weights.errors import CheckpointError
from verl_patches.weights.fp8_cast import run_fp8_cast
from verl_patches.weights.hf_dir import carried_over_files

INDEX = "model.safetensors.index.json"


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _redirect_one_shard(src, new_location, name_in_index):
    """Move the first shard to `new_location` and make the index name it `name_in_index`."""
    index = json.loads((src / INDEX).read_text())
    shard = sorted(set(index["weight_map"].values()))[0]
    shutil.move(src / shard, new_location)
    index["weight_map"] = {k: (name_in_index if v == shard else v) for k, v in index["weight_map"].items()}
    (src / INDEX).write_text(json.dumps(index))
    return shard


def test_shard_name_with_dotdot_cannot_write_outside_the_output_folder(fp8_dir, tmp_path):
    src = tmp_path / "in" / "src"
    shutil.copytree(fp8_dir, src)
    shard = _redirect_one_shard(src, tmp_path / "in" / "x.safetensors", "../x.safetensors")
    out_parent = tmp_path / "out"
    out_parent.mkdir()
    with pytest.raises(CheckpointError) as e:
        run_fp8_cast(src, out_parent / "dst", progress=False)
    msg = str(e.value)
    assert "'../x.safetensors'" in msg and INDEX in msg and "\n" not in msg
    assert _tree(out_parent) == []  # refused before anything was written, inside or outside
    assert shard


def test_absolute_shard_name_cannot_overwrite_the_input_in_place(fp8_dir, tmp_path):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = elsewhere / "victim.safetensors"
    _redirect_one_shard(src, victim, str(victim))
    before = victim.read_bytes()
    with pytest.raises(CheckpointError, match="victim.safetensors"):
        run_fp8_cast(src, tmp_path / "dst", progress=False)
    assert victim.read_bytes() == before
    assert not (tmp_path / "dst").exists()


def test_symlinked_tokenizer_file_pointing_outside_is_refused(fp8_dir, tmp_path):
    src = shutil.copytree(fp8_dir, tmp_path / "src")
    secret = tmp_path / "secret.txt"
    secret.write_text("private key\n")
    os.symlink(secret, src / "tokenizer.json")
    with pytest.raises(CheckpointError, match="tokenizer.json"):
        carried_over_files(src)
    with pytest.raises(CheckpointError, match="outside the model folder"):
        run_fp8_cast(src, tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()  # refused before any shard was written
    # a link to a device or a folder outside is refused the same way
    (src / "tokenizer.json").unlink()
    os.symlink("/dev/zero", src / "tokenizer.json")
    with pytest.raises(CheckpointError, match="/dev/zero"):
        carried_over_files(src)


def test_links_inside_the_folder_and_hub_cache_snapshots_are_still_followed(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "real_tokenizer.json").write_text("{}")
    os.symlink("real_tokenizer.json", plain / "tokenizer.json")
    assert [p.name for p in carried_over_files(plain)] == ["real_tokenizer.json", "tokenizer.json"]

    repo = tmp_path / "hub" / "models--deepseek-ai--DeepSeek-V3"
    snap = repo / "snapshots" / "abc123"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    (repo / "blobs" / "f00d").write_text("{}")
    os.symlink("../../blobs/f00d", snap / "tokenizer.json")
    assert [p.name for p in carried_over_files(snap)] == ["tokenizer.json"]


def test_deeply_nested_index_and_config_are_one_clear_error(tmp_path):
    from verl_patches.weights.config import read_config_json
    from verl_patches.weights.errors import ConfigError
    from verl_patches.weights.st_reader import CheckpointIndex

    deep = "[" * 100_000 + "]" * 100_000
    (tmp_path / INDEX).write_text('{"weight_map": ' + deep + "}")
    (tmp_path / "config.json").write_text('{"a": ' + deep + "}")
    with pytest.raises(CheckpointError, match="plausible depth"):
        CheckpointIndex.load(tmp_path)
    with pytest.raises(ConfigError, match="plausible depth"):
        read_config_json(tmp_path)
