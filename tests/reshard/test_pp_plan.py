"""Pipeline lockstep planner: aligned stages despite uneven layer lists and dense first layers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.model_dims import (
    DEEPSEEK_V3_CONFIG,
    PRODUCTION_LAYER_LIST,
    ModelDims,
    deepseek_v3_stage_params,
)
from verl_patches.reshard.pp_plan import (
    ParamSpec,
    global_name,
    layer_offsets,
    plan_pp_gather,
    split_layer_name,
    stage_of_layer,
    validate_layer_list,
)

DIMS = ModelDims.from_hf_config(DEEPSEEK_V3_CONFIG)


def production_stages():
    return [deepseek_v3_stage_params(DIMS, PRODUCTION_LAYER_LIST, s) for s in range(8)]


def test_offsets_and_stage_lookup():
    assert layer_offsets(PRODUCTION_LAYER_LIST) == (0, 7, 14, 22, 30, 38, 46, 54)
    assert [stage_of_layer(PRODUCTION_LAYER_LIST, n) for n in (0, 6, 7, 21, 22, 53, 54, 60)] == [0, 0, 1, 2, 3, 6, 7, 7]
    assert global_name("decoder.layers.2.mlp.router.weight", 14) == "decoder.layers.16.mlp.router.weight"
    assert global_name("module.decoder.layers.0.x", 7) == "module.decoder.layers.7.x"
    assert global_name("output_layer.weight", 54) == "output_layer.weight"


def test_production_stages_align():
    stages = production_stages()
    plan = plan_pp_gather(stages, PRODUCTION_LAYER_LIST)
    counts = {len(names) for names in plan.eligible}
    assert len(counts) == 1
    spec = [{p.name: p for p in params} for params in stages]
    for s in range(8):
        assert tuple(spec[s][n].shape for n in plan.eligible[s]) == plan.shapes
        # local index below min(num_layer_list) = 7, experts never included
        for n in plan.eligible[s]:
            assert split_layer_name(n)[0] < 7 and ".mlp.experts." not in n
    # stage 0's dense layers 0-2 contribute attention and norms but no MLP; MoE MLP of layers 3-6 is in
    stage0 = set(plan.eligible[0])
    assert "decoder.layers.0.self_attention.linear_proj.weight" in stage0
    assert "decoder.layers.0.pre_mlp_layernorm.weight" in stage0
    assert not any(n.startswith(("decoder.layers.0.mlp", "decoder.layers.2.mlp")) for n in stage0)
    assert "decoder.layers.3.mlp.router.weight" in stage0
    assert "decoder.layers.3.mlp.shared_experts.linear_fc1.weight" in stage0
    # global names: every global layer of stage s, no name twice across stages
    all_names = [n for s in range(8) for n in plan.global_names(s)]
    assert len(all_names) == len(set(all_names))
    assert {split_layer_name(n)[0] for n in plan.global_names(7)} == set(range(54, 61))
    assert {split_layer_name(n)[0] for n in plan.global_names(3)} == set(range(22, 29))  # 29 is extra
    assert plan.global_names(3)[0] == "decoder.layers.22.input_layernorm.weight"
    # stage-specific parameters are left to the legacy path
    assert "embedding.word_embeddings.weight" in plan.ineligible[0]
    assert "output_layer.weight" in plan.ineligible[7]
    assert "decoder.layers.7.input_layernorm.weight" in plan.ineligible[2]


def vendor_eligible(name: str, num_layer_list, first_k_dense: int) -> bool:
    """The vendor's name-pattern rule (item E3), as a reference."""
    if any(x in name for x in (".mlp.experts.weight", "embedding", "output_layer", "linear_qkv", "final_layernorm")):
        return False
    idx, _ = split_layer_name(name)
    if idx >= min(num_layer_list):
        return False
    mlp = any(x in name for x in ("linear_fc1.", "linear_fc2.", "router.weight"))
    return not (idx < first_k_dense and mlp)


def test_structural_rule_reproduces_vendor_rule_on_deepseek_v3():
    # The vendor iterates named_parameters (no router.expert_bias) and excludes linear_qkv.
    stages = [[p for p in params if "expert_bias" not in p.name] for params in production_stages()]
    plan = plan_pp_gather(stages, PRODUCTION_LAYER_LIST, exclude=(".mlp.experts.", "linear_qkv"))
    for s, params in enumerate(stages):
        want = [p.name for p in params if vendor_eligible(p.name, PRODUCTION_LAYER_LIST, 3)]
        assert list(plan.eligible[s]) == want


@st.composite
def random_models(draw):
    pp = draw(st.integers(1, 4))
    layer_list = draw(st.lists(st.integers(1, 4), min_size=pp, max_size=pp))
    first_dense = draw(st.integers(0, 3))
    suffixes = ["norm.weight", "attn.weight", "mlp.fc1.weight", "mlp.router.weight", "mlp.experts.weight1"]
    stages = []
    layer = 0
    for s, n in enumerate(layer_list):
        params = [ParamSpec("embedding.weight", (5, 3))] if s == 0 else []
        for local in range(n):
            dense = layer < first_dense
            for suf in suffixes:
                if dense and suf in ("mlp.router.weight", "mlp.experts.weight1"):
                    continue
                width = 7 if (dense and suf == "mlp.fc1.weight") else 3
                dtype = draw(st.sampled_from(["bfloat16", "float32"])) if suf == "norm.weight" else "bfloat16"
                params.append(ParamSpec(f"decoder.layers.{local}.{suf}", (width, 2), dtype))
            layer += 1
        stages.append(params)
    return stages, layer_list


@settings(max_examples=200, deadline=None)
@given(random_models(), st.one_of(st.none(), st.integers(1, 64)))
def test_plan_is_aligned_and_maximal(model, bucket_bytes):
    stages, layer_list = model
    plan = plan_pp_gather(stages, layer_list, bucket_bytes=bucket_bytes)
    specs = [{p.name: p for p in params} for params in stages]
    keys = [[split_layer_name(n) for n in names] for names in plan.eligible]
    assert all(k == keys[0] for k in keys)
    for s in range(len(stages)):
        assert [specs[s][n].shape for n in plan.eligible[s]] == list(plan.shapes)
        assert [specs[s][n].dtype for n in plan.eligible[s]] == list(plan.dtypes)
        assert sorted(plan.eligible[s] + plan.ineligible[s]) == sorted(specs[s])
    # maximal: anything aligned on every stage (and not an expert) was taken
    for p in stages[0]:
        key = split_layer_name(p.name)
        if key is None or "experts" in p.name:
            continue
        others = [[q for q in params if split_layer_name(q.name) == key] for params in stages]
        if all(o and o[0].shape == p.shape and o[0].dtype == p.dtype for o in others):
            assert p.name in plan.eligible[0]
    # buckets tile the eligible list, one dtype each, within the byte cap unless a single param
    flat = [i for a, b in plan.buckets for i in range(a, b)]
    assert flat == list(range(len(plan.shapes)))
    for b, (start, stop) in enumerate(plan.buckets):
        assert len(set(plan.dtypes[start:stop])) == 1
        if bucket_bytes is None:
            assert stop - start == 1
        elif stop - start > 1:
            assert plan.bucket_bytes(b) <= bucket_bytes


def test_invalid_layer_lists():
    with pytest.raises(InvalidLayoutError) as e:
        validate_layer_list([7, 7, 8], 8)
    assert e.value.condition == "layer_list_length_is_pp"
    with pytest.raises(InvalidLayoutError) as e:
        validate_layer_list([7, 7, 8, 8, 8, 8, 8, 8], 8, num_layers=61)
    assert e.value.condition == "layer_list_sums_to_num_layers" and "sums to 62" in str(e.value)
    with pytest.raises(InvalidLayoutError) as e:
        validate_layer_list([0, 2], 2)
    assert e.value.condition == "layer_list_positive"
    with pytest.raises(InvalidLayoutError) as e:
        plan_pp_gather([[ParamSpec("decoder.layers.2.x", (1,))], []], [2, 1])
    assert e.value.condition == "local_layer_index_in_stage"


def test_model_dims_from_config_names_missing_keys():
    cfg = dict(DEEPSEEK_V3_CONFIG)
    del cfg["moe_intermediate_size"]
    with pytest.raises(InvalidLayoutError) as e:
        ModelDims.from_hf_config(cfg)
    assert "moe_intermediate_size" in str(e.value)
    assert (DIMS.hidden, DIMS.moe_ffn, DIMS.num_experts, DIMS.moe_layers, DIMS.dtype_bytes) == (7168, 2048, 256, 58, 2)
