"""HF <-> legacy Megatron (MindSpeed-LLM DeepSeek-V3) conversion: layouts, round trips, resume, errors (J2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import verl_patches.weights.hf_to_mcore as h2m
from verl_patches.weights.errors import CheckpointError, LayoutError, MissingTensorError, ResumeError, VerifyError
from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore, plan_rank_shapes
from verl_patches.weights.layout import ParallelLayout, Rank, all_ranks, rank_dir_name, validate_layout
from verl_patches.weights.mcore_to_hf import convert_mcore_to_hf
from verl_patches.weights.st_reader import CheckpointIndex, LazyCheckpoint
from verl_patches.weights.verify import check_index_consistent, verify_hf_mcore_pair

from .mindspeed_oracle import reference_checkpoint

LAYOUTS = {
    "tp2": ParallelLayout(tp=2, moe_grouped_gemm=True),
    "pp2_uneven": ParallelLayout(pp=2, num_layer_list=(1, 3), moe_grouped_gemm=True),
    "ep2": ParallelLayout(ep=2, moe_grouped_gemm=True),
    "tp2_ep2": ParallelLayout(tp=2, ep=2, moe_grouped_gemm=True),
    "tp2_ep2_extend": ParallelLayout(tp=2, ep=2, moe_grouped_gemm=True, moe_tp_extend_ep=True),
    "tp2_pp2_ep2_extend": ParallelLayout(
        tp=2, pp=2, ep=2, num_layer_list=(3, 1), moe_grouped_gemm=True, moe_tp_extend_ep=True
    ),
    "tp2_ep2_local_experts": ParallelLayout(tp=2, ep=2),
}


def _hf_tensors(root: Path) -> dict[str, torch.Tensor]:
    with LazyCheckpoint(CheckpointIndex.load(root)) as ck:
        return {n: ck.get(n) for n in ck.index.weight_map}


def _load_rank(save: Path, layout: ParallelLayout, rank: Rank) -> dict:
    return torch.load(save / "iter_0000001" / rank_dir_name(layout, rank) / "model_optim_rng.pt", weights_only=True)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_mindspeed_and_round_trips_bit_for_bit(name, hf_dir, tiny_cfg, tmp_path):
    layout = LAYOUTS[name]
    save = tmp_path / "mcore"
    rep = convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    assert len(rep.written) == layout.tp * layout.pp * layout.ep

    assert (save / "latest_checkpointed_iteration.txt").read_text() == "1"
    dirs = sorted(p.name for p in (save / "iter_0000001").iterdir())
    assert dirs == sorted(rank_dir_name(layout, r) for r in all_ranks(layout))
    hf = _hf_tensors(hf_dir)
    oracle = reference_checkpoint(
        hf,
        tiny_cfg,
        layout.tp,
        layout.pp,
        layout.ep,
        layout.num_layer_list,
        layout.moe_grouped_gemm,
        layout.moe_tp_extend_ep,
    )
    for rank in all_ranks(layout):
        obj = _load_rank(save, layout, rank)
        assert (
            obj["checkpoint_version"] == 3.0
            and obj["iteration"] == 1
            and set(obj) == {"model", "checkpoint_version", "iteration"}
        )
        got, want = obj["model"], oracle[(rank.tp, rank.pp, rank.ep)]
        assert list(got) == list(plan_rank_shapes(tiny_cfg, layout, rank))
        assert set(got) == set(want), rank
        for key, t in want.items():
            assert got[key].dtype == t.dtype and torch.equal(got[key], t), (rank, key)
            # each saved tensor owns exactly its bytes (torch.save of a view would write the whole base)
            assert got[key].untyped_storage().nbytes() == got[key].numel() * got[key].element_size(), key

    back = tmp_path / "hf"
    convert_mcore_to_hf(save, back, max_shard_bytes=300_000, progress=False)
    check_index_consistent(back)
    restored = _hf_tensors(back)
    assert set(restored) == set(hf) and len(CheckpointIndex.load(back).files()) > 1
    for n, t in hf.items():
        assert restored[n].dtype == t.dtype and torch.equal(restored[n], t), n
    cfg = json.loads((back / "config.json").read_text())
    assert cfg == tiny_cfg


def test_layer_and_expert_placement_for_the_a3_shape(tiny_cfg):
    """Uneven PP puts layer 0 (dense) alone on stage 0 and TP-extend-EP gives whole experts per rank."""
    layout = LAYOUTS["tp2_pp2_ep2_extend"]
    stage0 = plan_rank_shapes(tiny_cfg, layout, Rank(1, 0, 1))
    assert "embedding.word_embeddings.weight" in stage0 and "output_layer.weight" not in stage0
    assert stage0["decoder.layers.0.mlp.linear_fc1.weight"][0] == (320, 160)  # dense, TP-sliced
    assert stage0["decoder.layers.1.mlp.experts.weight1"][0] == (160, 2 * 2 * 32)  # 2 whole experts
    assert stage0["decoder.layers.1.mlp.experts.weight2"][0] == (2 * 32, 160)
    stage1 = plan_rank_shapes(tiny_cfg, layout, Rank(0, 1, 0))
    assert sorted({k.split(".")[2] for k in stage1 if k.startswith("decoder.layers.")}) == ["0"]
    assert "output_layer.weight" in stage1


def test_verify_both_directions_and_detects_corruption(hf_dir, tiny_cfg, tmp_path):
    layout = LAYOUTS["tp2_ep2_extend"]
    save = tmp_path / "mcore"
    convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    rep = verify_hf_mcore_pair(hf_dir, save, layout, tiny_cfg, progress=False)
    assert rep.tensors_checked > 200
    back = tmp_path / "hf"
    convert_mcore_to_hf(save, back, progress=False)
    verify_hf_mcore_pair(back, save, layout, tiny_cfg, progress=False)

    rank = Rank(1, 0, 1)
    path = save / "iter_0000001" / rank_dir_name(layout, rank) / "model_optim_rng.pt"
    obj = torch.load(path, weights_only=True)
    obj["model"]["decoder.layers.2.mlp.experts.weight2"][3, 7] += 1
    torch.save(obj, path)
    from verl_patches.weights.errors import CheckpointError

    with pytest.raises(CheckpointError, match=f"^{path}: sha256 .* differs"):  # the converter's digest first
        verify_hf_mcore_pair(hf_dir, save, layout, tiny_cfg, progress=False)
    import hashlib
    import json

    man = json.loads((save / "conversion_manifest.json").read_text())  # the digest rewritten too: by value
    man["ranks"][rank_dir_name(layout, rank)]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (save / "conversion_manifest.json").write_text(json.dumps(man))
    with pytest.raises(VerifyError, match="decoder.layers.2.mlp.experts.weight2"):
        verify_hf_mcore_pair(hf_dir, save, layout, tiny_cfg, progress=False)


def test_interrupted_conversion_resumes_per_rank(hf_dir, tmp_path, monkeypatch):
    layout = LAYOUTS["tp2_pp2_ep2_extend"]
    save = tmp_path / "mcore"
    real = torch.save
    calls = {"n": 0}

    def flaky_save(obj, f, *a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        return real(obj, f, *a, **k)

    monkeypatch.setattr(h2m.torch, "save", flaky_save)
    with pytest.raises(KeyboardInterrupt):
        convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    assert not (save / "latest_checkpointed_iteration.txt").exists()  # not loadable while incomplete
    assert not list(save.rglob(".verl_patches-tmp-*"))
    monkeypatch.setattr(h2m.torch, "save", real)
    rep = convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    assert len(rep.skipped) == 3 and len(rep.written) == 5
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "1"
    again = convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    assert again.written == [] and len(again.skipped) == 8


def test_resuming_into_a_different_conversion_is_refused(hf_dir, tmp_path):
    save = tmp_path / "mcore"
    convert_hf_to_mcore(hf_dir, save, LAYOUTS["tp2"], progress=False)
    with pytest.raises(ResumeError, match="'layout'"):
        convert_hf_to_mcore(hf_dir, save, LAYOUTS["ep2"], progress=False)
    convert_hf_to_mcore(hf_dir, save, LAYOUTS["ep2"], overwrite=True, progress=False)
    assert sorted(p.name for p in (save / "iter_0000001").iterdir()) == ["mp_rank_00_000", "mp_rank_00_001"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(ResumeError, match="keep.txt"):
        convert_hf_to_mcore(hf_dir, other, LAYOUTS["tp2"], progress=False)


@pytest.mark.parametrize(
    "layout,kwargs,fragment",
    [
        (ParallelLayout(pp=2, num_layer_list=(1, 2)), {}, "sums to 3, not num_layers=4"),
        (ParallelLayout(pp=2, num_layer_list=(1, 1, 2)), {}, "has 3 entries"),
        (ParallelLayout(pp=3), {}, "not divisible by --target-pipeline-parallel-size 3"),
        (ParallelLayout(tp=3), {}, "num_attention_heads=4 .* --target-tensor-parallel-size 3"),
        (ParallelLayout(ep=3), {}, "n_routed_experts=8 is not divisible by --target-expert-parallel-size 3"),
        (ParallelLayout(tp=2, ep=8, moe_grouped_gemm=True, moe_tp_extend_ep=True), {}, "EP\\*TP=16"),
        (ParallelLayout(tp=2, ep=2, moe_tp_extend_ep=True), {}, "needs --moe-grouped-gemm"),
        (ParallelLayout(), {"num_layers": 61}, "--num-layers 61 differs"),
        (ParallelLayout(), {"first_k_dense_replace": 3}, "--first-k-dense-replace 3 differs"),
        (ParallelLayout(tp=0), {}, "--target-tensor-parallel-size must be a positive integer"),
    ],
)
def test_bad_flags_are_named_before_any_work(layout, kwargs, fragment, hf_dir, tiny_cfg, tmp_path):
    with pytest.raises(LayoutError, match=fragment):
        validate_layout(layout, tiny_cfg, kwargs.get("num_layers"), kwargs.get("first_k_dense_replace"))
    with pytest.raises(LayoutError, match=fragment):
        convert_hf_to_mcore(hf_dir, tmp_path / "out", layout, progress=False, **kwargs)
    assert not (tmp_path / "out").exists()


def _drop_tensor(src: Path, dst: Path, name: str) -> None:
    shutil.copytree(src, dst)
    raw = json.loads((dst / "model.safetensors.index.json").read_text())
    del raw["weight_map"][name]
    (dst / "model.safetensors.index.json").write_text(json.dumps(raw))


def test_missing_or_misshapen_tensor_is_named_before_any_work(hf_dir, tmp_path):
    bad = tmp_path / "bad"
    _drop_tensor(hf_dir, bad, "model.layers.3.mlp.experts.6.down_proj.weight")
    with pytest.raises(MissingTensorError, match="'model.layers.3.mlp.experts.6.down_proj.weight'"):
        convert_hf_to_mcore(bad, tmp_path / "out", LAYOUTS["ep2"], progress=False)
    assert not (tmp_path / "out").exists()

    bad2 = tmp_path / "bad2"
    shutil.copytree(hf_dir, bad2)
    cfg = json.loads((bad2 / "config.json").read_text())
    cfg["moe_intermediate_size"] = 64
    (bad2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'model.layers.1.mlp.shared_experts.gate_proj.weight' has shape"):
        convert_hf_to_mcore(bad2, tmp_path / "out2", LAYOUTS["ep2"], progress=False)


def test_fp8_source_is_refused(fp8_dir, tmp_path):
    with pytest.raises(CheckpointError, match="is FP8; convert the checkpoint with fp8_cast_bf16.py first"):
        convert_hf_to_mcore(fp8_dir, tmp_path / "out", LAYOUTS["tp2"], progress=False)


def test_reverse_without_manifest_needs_flags_and_config(hf_dir, tiny_cfg, tmp_path):
    layout = LAYOUTS["tp2_ep2_extend"]
    save = tmp_path / "mcore"
    convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    (save / "conversion_manifest.json").unlink()  # like a checkpoint saved by training
    with pytest.raises(LayoutError, match="give the layout flags"):
        convert_mcore_to_hf(save, tmp_path / "a", progress=False)
    with pytest.raises(CheckpointError, match="mp_rank_00/model_optim_rng.pt: rank file not found"):
        convert_mcore_to_hf(save, tmp_path / "b", layout=LAYOUTS["tp2"], config=tiny_cfg, progress=False)
    with pytest.raises(CheckpointError, match="local_experts.0.linear_fc1.weight' is missing .*wrong layout flags"):
        convert_mcore_to_hf(save, tmp_path / "b", layout=ParallelLayout(tp=2, ep=2), config=tiny_cfg, progress=False)
    convert_mcore_to_hf(save, tmp_path / "c", layout=layout, config=tiny_cfg, progress=False)
    verify_hf_mcore_pair(tmp_path / "c", save, layout, tiny_cfg, progress=False)


def test_reverse_reads_trained_checkpoints_and_names_missing_rank_files(hf_dir, tiny_cfg, tmp_path):
    import argparse

    import numpy as np

    layout = LAYOUTS["tp2"]
    save = tmp_path / "mcore"
    convert_hf_to_mcore(hf_dir, save, layout, progress=False)
    # a checkpoint as Megatron training writes it: other iteration, args, extra states
    it_dir = save / "iter_0000020"
    shutil.move(str(save / "iter_0000001"), str(it_dir))
    (save / "latest_checkpointed_iteration.txt").write_text("20")
    for r in all_ranks(layout):
        p = it_dir / rank_dir_name(layout, r) / "model_optim_rng.pt"
        obj = torch.load(p, weights_only=True)
        obj["args"] = argparse.Namespace(
            tensor_model_parallel_size=2, expert_model_parallel_size=1, moe_tp_extend_ep=False, moe_grouped_gemm=True
        )
        obj["model"]["decoder.layers.0.self_attention.core_attention._extra_state"] = None
        obj["rng_state"] = [{"np_rng_state": np.random.get_state()}]  # numpy arrays: data, built weights-only
        torch.save(obj, p)
    (save / "conversion_manifest.json").unlink()
    with pytest.raises(LayoutError, match="trained with moe_tp_extend_ep=False, the layout flags say True"):
        convert_mcore_to_hf(
            save,
            tmp_path / "hf",
            layout=ParallelLayout(tp=2, moe_grouped_gemm=True, moe_tp_extend_ep=True),
            config=tiny_cfg,
            progress=False,
        )
    convert_mcore_to_hf(save, tmp_path / "hf", layout=layout, config=tiny_cfg, progress=False)
    hf = _hf_tensors(hf_dir)
    back = _hf_tensors(tmp_path / "hf")
    assert all(torch.equal(back[n], t) for n, t in hf.items())

    (it_dir / rank_dir_name(layout, Rank(1, 0, 0)) / "model_optim_rng.pt").unlink()
    with pytest.raises(CheckpointError, match="mp_rank_01/model_optim_rng.pt: rank file not found"):
        convert_mcore_to_hf(save, tmp_path / "hf2", layout=layout, config=tiny_cfg, progress=False)


def test_hf_export_loads_in_transformers(hf_dir, tiny_cfg, tmp_path):
    from transformers import DeepseekV3ForCausalLM

    save = tmp_path / "mcore"
    convert_hf_to_mcore(hf_dir, save, LAYOUTS["tp2_pp2_ep2_extend"], progress=False)
    back = tmp_path / "hf"
    convert_mcore_to_hf(save, back, progress=False)
    model = DeepseekV3ForCausalLM.from_pretrained(back, torch_dtype=torch.bfloat16)
    hf = _hf_tensors(hf_dir)
    sd = model.state_dict()
    assert all(torch.equal(sd[n], t.to(sd[n].dtype)) for n, t in hf.items() if n in sd)
    assert {n for n in sd if "rotary" not in n} == set(hf)
