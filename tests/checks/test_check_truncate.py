"""--layers/--experts truncation: the plan (exhaustive over small configs), the streamed HF writer and the
Megatron read-out, on a tiny DeepSeek-V3 (3 layers, first dense, 8 routed experts)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from verl_patches.checks.truncate import (
    TensorPick,
    plan_shards,
    plan_truncation,
    truncate_hf,
    truncate_mcore_to_hf,
    truncated_config,
    write_hf_folder,
)
from verl_patches.weights.config import make_tiny_config
from verl_patches.weights.errors import ConfigError
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.st_writer import TensorSpec


def _cfg(**kw):
    base = dict(
        num_hidden_layers=4,
        first_k_dense_replace=2,
        n_routed_experts=16,
        n_group=4,
        topk_group=2,
        num_experts_per_tok=4,
    )
    base.update(kw)
    return make_tiny_config(64, **base)


@pytest.mark.parametrize("layers,experts", list(itertools.product([None, 1, 2, 3, 4], [None, 8, 12, 16])))
def test_plan_keeps_the_first_layers_and_experts_and_slices_the_router(layers, experts):
    cfg = _cfg()
    out, picks = plan_truncation(cfg, layers, experts)
    k, m = layers or 4, experts or 16
    assert out["num_hidden_layers"] == k and out["n_routed_experts"] == m and out["num_nextn_predict_layers"] == 0
    assert out["first_k_dense_replace"] == min(2, k)
    names = [p.name for p in picks]
    assert names == [s.name for s in hf_tensor_specs(out)]
    assert {int(n.split(".")[2]) for n in names if n.startswith("model.layers.")} == set(range(k))
    experts_seen = {int(n.split(".mlp.experts.")[1].split(".")[0]) for n in names if ".mlp.experts." in n}
    assert experts_seen == (set(range(m)) if k > 2 else set())
    for p in picks:
        router = p.name.endswith((".mlp.gate.weight", ".mlp.gate.e_score_correction_bias"))
        assert p.rows == (m if router and m < 16 else None), p


@pytest.mark.parametrize(
    "kw,flag",
    [
        (dict(layers=0), "--layers 0"),
        (dict(layers=5), "--layers 5"),
        (dict(experts=0), "--experts 0"),
        (dict(experts=17), "--experts 17"),
        (dict(experts=6), "not divisible by n_group=4"),
        (dict(experts=4), "at least 8 experts"),
    ],
)
def test_impossible_requests_name_the_flag(kw, flag):
    with pytest.raises(ConfigError, match=flag):
        truncated_config(_cfg(), kw.get("layers"), kw.get("experts"))


def test_the_router_must_still_be_able_to_pick_its_experts():
    # 2 experts per group, 1 group picked, 4 experts per token: 2 groups x 2 would be needed
    with pytest.raises(ConfigError, match="num_experts_per_tok=4"):
        truncated_config(_cfg(topk_group=1), None, 8)
    assert truncated_config(_cfg(topk_group=2), None, 8)["n_routed_experts"] == 8


def test_plan_shards_is_order_preserving_and_bounded():
    specs = [TensorSpec(f"t{i}", torch.float32, (n,)) for i, n in enumerate([3, 5, 1, 10, 2, 2])]
    for limit in range(1, 60):
        shards = plan_shards(specs, limit)
        assert [s for g in shards for s in g] == specs
        for g in shards:
            assert len(g) == 1 or sum(s.nbytes for s in g) <= limit


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    from tests.megatron_engine.golden_assets import build_hf_model

    return build_hf_model(tmp_path_factory.mktemp("trunc"))


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    out = {}
    for fname in sorted(set(index.values())):
        with safe_open(str(folder / fname), "pt") as f:
            for k in f.keys():
                assert index[k] == fname
                out[k] = f.get_tensor(k)
    return out


def test_truncated_hf_folder_holds_exactly_the_slice_and_loads(tiny_hf, tmp_path):
    from transformers import DeepseekV3ForCausalLM

    out = truncate_hf(tiny_hf, tmp_path / "t", layers=2, experts=4, max_shard_bytes=64 << 10)
    src = _tensors(tiny_hf) if (tiny_hf / "model.safetensors.index.json").exists() else None
    if src is None:
        with safe_open(str(tiny_hf / "model.safetensors"), "pt") as f:
            src = {k: f.get_tensor(k) for k in f.keys()}
    got = _tensors(out)
    assert len(list(out.glob("*.safetensors"))) > 1  # the shard bound was applied
    assert not list(out.glob("*.tmp*")) and not list(out.glob(".*"))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 2 and cfg["n_routed_experts"] == 4
    assert (out / "tokenizer.json").is_file()
    assert set(got) == {s.name for s in hf_tensor_specs(cfg)}
    for name, t in got.items():
        want = src[name][:4] if name.endswith((".mlp.gate.weight", "e_score_correction_bias")) else src[name]
        assert t.dtype == want.dtype and torch.equal(t, want), name
    model = DeepseekV3ForCausalLM.from_pretrained(out, torch_dtype=torch.float32)
    assert len(model.model.layers) == 2 and len(model.model.layers[1].mlp.experts) == 4


def test_writer_reads_one_tensor_at_a_time_in_checkpoint_order(tmp_path):
    cfg = make_tiny_config(
        32,
        num_hidden_layers=2,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=2,
    )
    specs = {s.name: s for s in hf_tensor_specs(cfg, torch.float32)}
    picks = [TensorPick(n) for n in specs]
    order, alive = [], []

    def read(p: TensorPick) -> torch.Tensor:
        order.append(p.name)
        t = torch.full(specs[p.name].shape, float(len(order)))
        alive.append(t)
        return t

    write_hf_folder(
        tmp_path / "o",
        cfg,
        picks,
        lambda n: (specs[n].dtype, specs[n].shape),
        read,
        carry_from=None,
        max_shard_bytes=1 << 14,
    )
    assert order == [p.name for p in picks]
    got = _tensors(tmp_path / "o")
    assert all(float(got[n].reshape(-1)[0]) == i + 1 for i, n in enumerate(order))


def test_megatron_readout_equals_the_hf_slice(tiny_hf, tmp_path):
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout

    layout = ParallelLayout(tp=2, pp=1, ep=2, moe_grouped_gemm=True, moe_tp_extend_ep=True)
    convert_hf_to_mcore(tiny_hf, tmp_path / "mcore", layout, progress=False)
    a = _tensors(truncate_hf(tiny_hf, tmp_path / "a", layers=3, experts=4))
    b = _tensors(truncate_mcore_to_hf(tmp_path / "mcore", tmp_path / "b", 3, 4, tokenizer_dir=tiny_hf))
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k].to(a[k].dtype)), k
    assert (tmp_path / "b" / "tokenizer.json").is_file()
