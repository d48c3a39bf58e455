"""Megatron (MindSpeed-LLM DeepSeek-V3) <-> HF name table, as used by the rollout weight sync (G10)."""

from __future__ import annotations

import pytest
import torch

from verl_patches.weights.config import make_tiny_config
from verl_patches.weights.hf_to_mcore import plan_rank_shapes
from verl_patches.weights.layout import ParallelLayout, Rank
from verl_patches.weights.names import UnknownNameError, hf_to_mcore_name, mcore_to_hf_names

CFG = make_tiny_config(128, num_hidden_layers=5, first_k_dense_replace=3, n_routed_experts=8)


@pytest.fixture(scope="module")
def hf_keys() -> set[str]:
    """The parameter names transformers' own DeepseekV3 model has (the HF index key set)."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    with torch.device("meta"):
        model = DeepseekV3ForCausalLM(DeepseekV3Config(**CFG))
    return set(model.state_dict())


def _mcore_names(grouped: bool) -> list[str]:
    """Names of a PP=1 Megatron model with global layer indices, as verl hands them to the sync."""
    return list(plan_rank_shapes(CFG, ParallelLayout(moe_grouped_gemm=grouped), Rank(0, 0, 0)))


def _layer(names, layer: int, prefix: str) -> set[str]:
    return {n for n in names if n.startswith(f"{prefix}{layer}.")}


# (megatron name, number of HF tensors it expands to)
TABLE = [
    ("embedding.word_embeddings.weight", ["model.embed_tokens.weight"]),
    ("decoder.final_layernorm.weight", ["model.norm.weight"]),
    ("output_layer.weight", ["lm_head.weight"]),
    ("decoder.layers.0.input_layernorm.weight", ["model.layers.0.input_layernorm.weight"]),
    (
        "decoder.layers.0.self_attention.linear_qkv.weight",
        ["model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight"],
    ),
    ("decoder.layers.0.self_attention.linear_proj.weight", ["model.layers.0.self_attn.o_proj.weight"]),
    ("decoder.layers.0.self_attention.k_layernorm.weight", ["model.layers.0.self_attn.kv_a_layernorm.weight"]),
    ("decoder.layers.0.self_attention.q_layernorm.weight", ["model.layers.0.self_attn.q_a_layernorm.weight"]),
    ("decoder.layers.0.self_attention.linear_kvb.weight", ["model.layers.0.self_attn.kv_b_proj.weight"]),
    ("decoder.layers.0.self_attention.linear_qb.weight", ["model.layers.0.self_attn.q_b_proj.weight"]),
    ("decoder.layers.0.pre_mlp_layernorm.weight", ["model.layers.0.post_attention_layernorm.weight"]),
    (
        "decoder.layers.0.mlp.linear_fc1.weight",
        ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"],
    ),
    ("decoder.layers.0.mlp.linear_fc2.weight", ["model.layers.0.mlp.down_proj.weight"]),
    ("decoder.layers.3.mlp.router.weight", ["model.layers.3.mlp.gate.weight"]),
    ("decoder.layers.3.mlp.router.expert_bias", ["model.layers.3.mlp.gate.e_score_correction_bias"]),
    (
        "decoder.layers.3.mlp.shared_experts.linear_fc1.weight",
        ["model.layers.3.mlp.shared_experts.gate_proj.weight", "model.layers.3.mlp.shared_experts.up_proj.weight"],
    ),
    ("decoder.layers.3.mlp.shared_experts.linear_fc2.weight", ["model.layers.3.mlp.shared_experts.down_proj.weight"]),
    (
        "decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight",
        ["model.layers.3.mlp.experts.5.gate_proj.weight", "model.layers.3.mlp.experts.5.up_proj.weight"],
    ),
    (
        "decoder.layers.3.mlp.experts.local_experts.5.linear_fc2.weight",
        ["model.layers.3.mlp.experts.5.down_proj.weight"],
    ),
]


@pytest.mark.parametrize("mcore,hf", TABLE)
def test_table(mcore, hf):
    assert mcore_to_hf_names(mcore) == hf
    for pos, name in enumerate(hf):
        assert hf_to_mcore_name(name, grouped_gemm="local_experts" not in mcore) == (mcore, pos)


def test_grouped_gemm_expands_to_every_expert_gate_up_interleaved():
    w1 = mcore_to_hf_names("decoder.layers.3.mlp.experts.weight1", num_experts=8)
    assert len(w1) == 16
    assert w1[:4] == [
        "model.layers.3.mlp.experts.0.gate_proj.weight",
        "model.layers.3.mlp.experts.0.up_proj.weight",
        "model.layers.3.mlp.experts.1.gate_proj.weight",
        "model.layers.3.mlp.experts.1.up_proj.weight",
    ]
    w2 = mcore_to_hf_names("decoder.layers.3.mlp.experts.weight2", num_experts=8)
    assert w2 == [f"model.layers.3.mlp.experts.{e}.down_proj.weight" for e in range(8)]
    assert hf_to_mcore_name("model.layers.3.mlp.experts.6.up_proj.weight") == (
        "decoder.layers.3.mlp.experts.weight1",
        13,
    )
    assert hf_to_mcore_name("model.layers.3.mlp.experts.6.down_proj.weight") == (
        "decoder.layers.3.mlp.experts.weight2",
        6,
    )
    with pytest.raises(ValueError, match="num_experts"):
        mcore_to_hf_names("decoder.layers.3.mlp.experts.weight1")


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("layer", [0, 3])  # dense layer 0, MoE layer 3
def test_layer_maps_onto_exactly_the_hf_key_set(hf_keys, layer, grouped):
    mcore = _layer(_mcore_names(grouped), layer, "decoder.layers.")
    mapped = [h for n in mcore for h in mcore_to_hf_names(n, num_experts=CFG["n_routed_experts"])]
    assert len(mapped) == len(set(mapped))  # every HF tensor comes from exactly one Megatron tensor
    assert set(mapped) == _layer(hf_keys, layer, "model.layers.")


def test_whole_model_and_inverse(hf_keys):
    names = _mcore_names(True)
    mapped = {h for n in names for h in mcore_to_hf_names(n, num_experts=CFG["n_routed_experts"])}
    assert mapped == {k for k in hf_keys if "rotary_emb" not in k}
    for h in mapped:
        m, pos = hf_to_mcore_name(h)
        assert mcore_to_hf_names(m, num_experts=CFG["n_routed_experts"])[pos] == h


@pytest.mark.parametrize(
    "bad",
    [
        "decoder.layers.0.mlp.nonsense.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "embedding.position_embeddings.weight",
    ],
)
def test_unknown_names_raise(bad):
    with pytest.raises(UnknownNameError, match="not a"):
        (hf_to_mcore_name if bad.startswith("model.") else mcore_to_hf_names)(bad)
