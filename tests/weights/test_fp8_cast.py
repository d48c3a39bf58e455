"""Streaming FP8 -> BF16 checkpoint conversion: values, index/config consistency, resume, errors (J1)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

import verl_patches.weights.fp8_cast as fp8_cast
from verl_patches.base.atomic_write import atomic_path
from verl_patches.weights.errors import CheckpointError, MissingTensorError, ResumeError, VerifyError
from verl_patches.weights.fp8_cast import MANIFEST_FILE, SCALE_SUFFIX, run_fp8_cast
from verl_patches.weights.st_reader import CheckpointIndex, LazyCheckpoint
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file
from verl_patches.weights.verify import check_index_consistent, verify_fp8_cast


def _rewrite(path, tensors):
    """Replace a shard (via a new inode: the loaded tensors may still map the old file)."""
    with atomic_path(path) as tmp:
        write_safetensors_file(
            tmp, [TensorSpec(k, v.dtype, tuple(v.shape)) for k, v in tensors.items()], lambda s: tensors[s.name]
        )


def _all(root):
    out = {}
    for f in CheckpointIndex.load(root).files():
        out.update(load_file(str(root / f)))
    return out


def _reference(src, name):
    """Dense float32 reference: each element times its own block's scale."""
    w, s = src[name], src[name + SCALE_SUFFIX]
    rows, cols = torch.arange(w.shape[0]) // 128, torch.arange(w.shape[1]) // 128
    return w.float() * s[rows][:, cols]


def test_fixture_has_cross_shard_scales_and_ragged_blocks(fp8_dir):
    idx = CheckpointIndex.load(fp8_dir)
    cross = [
        n
        for n in idx.weight_map
        if n.endswith(SCALE_SUFFIX) and idx.weight_map[n] != idx.weight_map[n[: -len(SCALE_SUFFIX)]]
    ]
    assert len(idx.files()) == 4 and len(cross) >= 5
    with LazyCheckpoint(idx) as ck:
        assert ck.shape("model.layers.0.mlp.gate_proj.weight") == (320, 160)  # 3 x 2 blocks, both ragged


def test_output_equals_reference_and_index_config_are_consistent(fp8_dir, bf16_dir):
    src, out = _all(fp8_dir), _all(bf16_dir)
    fp8_names = [n for n, t in src.items() if t.dtype == torch.float8_e4m3fn]
    assert len(fp8_names) > 100
    for name in fp8_names:
        assert out[name].dtype == torch.bfloat16
        assert torch.equal(out[name], _reference(src, name).to(torch.bfloat16)), name
    for name, t in src.items():
        if name.endswith(SCALE_SUFFIX):
            assert name not in out
        elif t.dtype != torch.float8_e4m3fn:
            assert t.dtype == out[name].dtype and torch.equal(t, out[name]), name
    assert set(out) == {n for n in src if not n.endswith(SCALE_SUFFIX)}

    index = check_index_consistent(bf16_dir)
    assert not [n for n in index.weight_map if "scale_inv" in n]
    assert index.metadata["total_size"] == sum(t.numel() * t.element_size() for t in out.values())
    cfg = json.loads((bf16_dir / "config.json").read_text())
    src_cfg = json.loads((fp8_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["torch_dtype"] == "bfloat16"
    assert {k: v for k, v in cfg.items() if k != "torch_dtype"} == {
        k: v for k, v in src_cfg.items() if k not in ("quantization_config", "torch_dtype")
    }
    for f in ("tokenizer_config.json", "generation_config.json"):
        assert (bf16_dir / f).read_bytes() == (fp8_dir / f).read_bytes()
    man = json.loads((bf16_dir / MANIFEST_FILE).read_text())
    assert man["complete"] and sorted(man["shards"]) == index.files()
    assert not [p for p in bf16_dir.iterdir() if p.name.startswith(".verl_patches-tmp-")]


def test_verify_passes_and_catches_a_corrupted_tensor(fp8_dir, bf16_dir, tmp_path):
    rep = verify_fp8_cast(fp8_dir, bf16_dir, progress=False)
    assert rep.tensors_dequantized > 100 and 0 < rep.max_rel_err <= 2**-8
    bad = tmp_path / "bad"
    shutil.copytree(bf16_dir, bad)
    index = CheckpointIndex.load(bad)
    name = "model.layers.2.mlp.experts.5.down_proj.weight"
    fname = index.weight_map[name]
    tensors = load_file(str(bad / fname))
    tensors[name] = tensors[name].clone()
    tensors[name][1, 2] *= 1.02  # beyond BF16 rounding
    _rewrite(bad / fname, tensors)
    with pytest.raises(VerifyError, match=name):
        verify_fp8_cast(fp8_dir, bad, progress=False)


def test_transformers_loads_the_bf16_output(fp8_dir, bf16_dir):
    from transformers import DeepseekV3ForCausalLM

    model = DeepseekV3ForCausalLM.from_pretrained(bf16_dir, torch_dtype=torch.bfloat16).eval()
    src = _all(fp8_dir)
    sd = model.state_dict()
    name = "model.layers.1.self_attn.kv_b_proj.weight"
    assert torch.equal(sd[name], _reference(src, name).to(torch.bfloat16))
    assert torch.equal(sd["lm_head.weight"], src["lm_head.weight"])
    with torch.no_grad():
        logits = model(torch.tensor([[1, 5, 9, 2]])).logits
    assert logits.shape == (1, 4, 256) and torch.isfinite(logits).all()


def test_rerun_skips_verified_shards_and_redoes_a_damaged_one(fp8_dir, tmp_path):
    out = tmp_path / "out"
    first = run_fp8_cast(fp8_dir, out, progress=False)
    assert len(first.written) == 4
    again = run_fp8_cast(fp8_dir, out, progress=False)
    assert again.written == [] and len(again.skipped) == 4
    victim = sorted(p for p in out.glob("*.safetensors"))[1]
    good = victim.read_bytes()
    victim.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))  # same size, different checksum
    third = run_fp8_cast(fp8_dir, out, progress=False)
    assert third.written == [victim.name] and victim.read_bytes() == good


def test_interrupted_run_leaves_no_index_and_resumes(fp8_dir, tmp_path, monkeypatch):
    out = tmp_path / "out"
    real = fp8_cast.dequantize_fp8_blockwise
    victim = "model.layers.3.mlp.experts.2.up_proj.weight"

    def crash(w, s, block=(128, 128), **kw):
        if crash.armed and crash.calls == 100:
            raise KeyboardInterrupt  # like Ctrl-C in the middle of a shard
        crash.calls += 1
        return real(w, s, block, **kw)

    crash.armed, crash.calls = True, 0
    monkeypatch.setattr(fp8_cast, "dequantize_fp8_blockwise", crash)
    with pytest.raises(KeyboardInterrupt):
        run_fp8_cast(fp8_dir, out, progress=False)
    assert not (out / "model.safetensors.index.json").exists() and not (out / "config.json").exists()
    assert not [p for p in out.iterdir() if p.name.startswith(".verl_patches-tmp-")]
    done = json.loads((out / MANIFEST_FILE).read_text())["shards"]
    assert 1 <= len(done) < 4 and not json.loads((out / MANIFEST_FILE).read_text())["complete"]

    crash.armed = False
    rep = run_fp8_cast(fp8_dir, out, progress=False)
    assert sorted(rep.skipped) == sorted(done) and len(rep.written) == 4 - len(done)
    assert victim in CheckpointIndex.load(out).weight_map
    verify_fp8_cast(fp8_dir, out, progress=False)


def test_drop_mtp(fp8_dir, tmp_path):
    out = tmp_path / "nomtp"
    rep = run_fp8_cast(fp8_dir, out, drop_mtp=True, progress=False)
    names = CheckpointIndex.load(out).weight_map
    assert rep.tensors_dropped > 0 and not [n for n in names if n.startswith("model.layers.4.")]
    assert json.loads((out / "config.json").read_text())["num_nextn_predict_layers"] == 0
    verify_fp8_cast(fp8_dir, out, progress=False)


def test_workers_in_parallel_give_identical_files(fp8_dir, bf16_dir, tmp_path):
    out = tmp_path / "par"
    run_fp8_cast(fp8_dir, out, workers=2, progress=False)
    for f in CheckpointIndex.load(bf16_dir).files():
        assert (out / f).read_bytes() == (bf16_dir / f).read_bytes()


def _copy_without(src, dst, drop):
    shutil.copytree(src, dst)
    index = CheckpointIndex.load(dst)
    fname = index.weight_map[drop]
    _rewrite(dst / fname, {k: v for k, v in load_file(str(dst / fname)).items() if k != drop})
    return index


def test_missing_scale_is_named(fp8_dir, tmp_path):
    bad = tmp_path / "src"
    scale = "model.layers.2.self_attn.o_proj.weight" + SCALE_SUFFIX
    index = _copy_without(fp8_dir, bad, scale)
    raw = json.loads((bad / "model.safetensors.index.json").read_text())
    del raw["weight_map"][scale]
    (bad / "model.safetensors.index.json").write_text(json.dumps(raw))
    with pytest.raises(MissingTensorError, match="'model.layers.2.self_attn.o_proj.weight' has no"):
        run_fp8_cast(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()  # checked before anything is written
    assert index  # the fixture copy was used


def test_index_listing_a_tensor_absent_from_its_shard_is_named(fp8_dir, tmp_path):
    bad = tmp_path / "src"
    _copy_without(fp8_dir, bad, "model.layers.1.input_layernorm.weight")
    with pytest.raises(MissingTensorError, match="'model.layers.1.input_layernorm.weight' listed in the index"):
        run_fp8_cast(bad, tmp_path / "out", progress=False)


def test_missing_shard_and_foreign_output_dir(fp8_dir, tmp_path):
    bad = tmp_path / "src"
    shutil.copytree(fp8_dir, bad)
    (bad / "model-00003-of-00004.safetensors").unlink()
    with pytest.raises(CheckpointError, match="model-00003-of-00004.safetensors"):
        run_fp8_cast(bad, tmp_path / "out", progress=False)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(ResumeError, match="notes.txt"):
        run_fp8_cast(fp8_dir, foreign, progress=False)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
