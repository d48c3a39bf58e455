"""C1 weight loading: each rank finds its own file of our converter's legacy layout, a checkpoint cut for
another layout or an unfinished conversion is refused with what to change, and the strict copy names
missing, unexpected and misshapen parameters. The load into a real MindSpeed-LLM model is in the golden test."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl_patches.patches.verl.workers.legacy_checkpoint import RunningLayout, load_into, plan_rank_file
from verl_patches.weights.config import make_tiny_config
from verl_patches.weights.errors import CheckpointError, LayoutError
from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
from verl_patches.weights.layout import ParallelLayout
from verl_patches.weights.mcore_to_hf import load_rank_file
from verl_patches.weights.synthetic import write_synthetic_checkpoint

LAYOUT = ParallelLayout(tp=2, pp=2, ep=2, num_layer_list=(1, 2), moe_grouped_gemm=True, moe_tp_extend_ep=True)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    cfg = make_tiny_config(
        64,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=3,
        first_k_dense_replace=1,
        n_routed_experts=4,
        n_group=1,
        topk_group=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    hf = tmp_path_factory.mktemp("hf")
    write_synthetic_checkpoint(hf, cfg, num_shards=1, seed=3)
    out = tmp_path_factory.mktemp("mcore")
    convert_hf_to_mcore(hf, out, LAYOUT, progress=False)
    return out


def running(tp_rank: int, pp_rank: int, ep_rank: int, **kw) -> RunningLayout:
    base = dict(tp=2, pp=2, ep=2, num_layer_list=(1, 2), moe_tp_extend_ep=True)
    base.update(kw)
    return RunningLayout(tp_rank=tp_rank, pp_rank=pp_rank, ep_rank=ep_rank, **base)


def test_every_rank_gets_its_own_file(ckpt: Path) -> None:
    seen = set()
    for tp in range(2):
        for pp in range(2):
            for ep in range(2):
                path = plan_rank_file(ckpt, running(tp, pp, ep))
                assert path.is_file()
                assert path.parent.name == f"mp_rank_{tp:02d}_{pp:03d}_{ep:03d}"
                assert path.parent.parent.name == "iter_0000001"
                seen.add(path)
    assert len(seen) == 8
    # stage 1 holds the last two layers, numbered from 0 inside the stage, and the output layer
    sd, _ = load_rank_file(plan_rank_file(ckpt, running(0, 1, 0)))
    layers = {k.split(".")[2] for k in sd if k.startswith("decoder.layers.")}
    assert layers == {"0", "1"} and "output_layer.weight" in sd and "embedding.word_embeddings.weight" not in sd


@pytest.mark.parametrize(
    "kw, what",
    [
        (dict(tp=1), "tp: checkpoint 2, running 1"),
        (dict(ep=1), "ep: checkpoint 2, running 1"),
        (dict(moe_tp_extend_ep=False), "moe_tp_extend_ep: checkpoint True, running False"),
        (dict(num_layer_list=(2, 1)), "num_layer_list: checkpoint (1, 2), running (2, 1)"),
    ],
)
def test_another_layout_is_refused_with_both_values(ckpt: Path, kw: dict, what: str) -> None:
    with pytest.raises(LayoutError, match=what.replace("(", r"\(").replace(")", r"\)")):
        plan_rank_file(ckpt, running(0, 0, 0, **kw))


def test_unconverted_or_unfinished_directories_are_refused(ckpt: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no conversion manifest"):
        plan_rank_file(tmp_path, running(0, 0, 0))
    import json

    manifest = json.loads((ckpt / "conversion_manifest.json").read_text())
    manifest["complete"] = False
    (tmp_path / "conversion_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="did not finish"):
        plan_rank_file(tmp_path, running(0, 0, 0))


def test_load_into_is_strict_and_names_the_parameter(tmp_path: Path) -> None:
    m = torch.nn.Sequential(torch.nn.Linear(3, 2, bias=False))
    where = tmp_path / "rank.pt"
    w = torch.arange(6.0).view(2, 3)
    load_into(m, {"0.weight": w}, where)
    assert torch.equal(m[0].weight.detach(), w)
    with pytest.raises(CheckpointError, match=r"missing \['0.weight'\].*unexpected \['0.bias'\]"):
        load_into(m, {"0.bias": w}, where)
    with pytest.raises(CheckpointError, match=r"0.weight has shape \(3, 2\), the model expects \(2, 3\)"):
        load_into(m, {"0.weight": w.t()}, where)
    assert str(where) in str(pytest.raises(CheckpointError, load_into, m, {}, where).value)
