"""Pure parts of the weight sync: path flag, parameter table, plan routes, lower bound, tensor conversions."""

from __future__ import annotations

import pytest
import torch

from tests.sync import sync_testlib as L
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.sync.convert import merge_tp, to_hf
from verl_patches.sync.param_table import full_shape, kind_of
from verl_patches.sync.path import ALL_GATHER, ALL_TO_ALL, active_sync_path, describe_sync_path
from verl_patches.sync.plan import SyncPath, build_sync_plan, lower_bound
from verl_patches.weights import tensor_layout as tl


@pytest.mark.parametrize(
    "env, want",
    [
        ({}, ALL_TO_ALL),
        ({"NO_ALL_TO_ALL_RESHARD": "0"}, ALL_TO_ALL),
        ({"NO_ALL_TO_ALL_RESHARD": ""}, ALL_TO_ALL),
        ({"NO_ALL_TO_ALL_RESHARD": "1"}, ALL_GATHER),
        ({"NO_ALL_TO_ALL_RESHARD": "true"}, ALL_GATHER),
    ],
)
def test_sync_path_flag(env, want):
    assert active_sync_path(env) == want
    assert describe_sync_path(env)["path"] == want


def test_a_bad_flag_value_is_one_clear_error():
    with pytest.raises(ValueError, match="NO_ALL_TO_ALL_RESHARD='maybe'"):
        active_sync_path({"NO_ALL_TO_ALL_RESHARD": "maybe"})
    assert describe_sync_path({"NO_ALL_TO_ALL_RESHARD": "maybe"})["path"] == "invalid"


@pytest.fixture(scope="module")
def plans():
    cfg = L.tiny_cfg()
    return {p: build_sync_plan(cfg, L.training_layout(), L.rollout_layout(), L.LAYER_LIST, path=p) for p in SyncPath}


def test_every_non_expert_parameter_takes_exactly_one_route(plans):
    plan = plans[SyncPath.ALL_TO_ALL]
    everything = {p.global_name for s in plan.stages for p in s}
    lockstep = [p.global_name for s in range(plan.training.pp) for p in plan.lockstep_params(s)]
    legacy = [p.global_name for p in plan.legacy]
    assert len(lockstep) + len(legacy) == len(everything)
    assert set(lockstep) | set(legacy) == everything
    assert not any(".mlp.experts." in n for n in everything)
    # the routes the vendor's rules predict for layers [2, 3] with one dense layer
    assert {"embedding.word_embeddings.weight", "output_layer.weight", "decoder.final_layernorm.weight"} <= set(legacy)
    assert "decoder.layers.4.self_attention.linear_qkv.weight" in legacy  # local index 2 exists on stage 1 only
    assert "decoder.layers.0.mlp.linear_fc1.weight" in legacy  # dense on stage 0, MoE on stage 1
    assert "decoder.layers.2.mlp.router.expert_bias" in legacy
    assert "decoder.layers.0.self_attention.linear_qb.weight" in lockstep
    assert "decoder.layers.1.mlp.router.expert_bias" in lockstep


def test_all_gather_path_takes_the_legacy_route_for_everything(plans):
    ag = plans[SyncPath.ALL_GATHER]
    assert ag.pp_plan is None and len(ag.legacy) == sum(len(s) for s in ag.stages)


def test_moe_layers_and_expert_plans_follow_the_uneven_layer_list(plans):
    plan = plans[SyncPath.ALL_TO_ALL]
    assert plan.moe == ((1, 0, 1), (2, 1, 0), (3, 1, 1), (4, 1, 2))
    assert [p.holder_stage for p in plan.expert_plans] == [0, 1]


def test_lower_bound_does_not_depend_on_the_path_and_counts_held_shards(plans):
    a2a, ag = plans[SyncPath.ALL_TO_ALL], plans[SyncPath.ALL_GATHER]
    for rank in range(L.WORLD):
        assert lower_bound(a2a, rank) == lower_bound(ag, rank)
    # rank 0 (stage 0) holds half of each TP-split stage-0 tensor and every replicated one
    stage0 = sum(p.full_bytes - (p.local_bytes if p.is_tp_split else p.full_bytes) for p in a2a.stages[0])
    stage1 = sum(p.full_bytes for p in a2a.stages[1])
    ep = [a2a.expert_plans[s] for _, s, _ in a2a.moe]
    experts = sum(len([e for e in p.needed(0) if e not in p.held(0)]) for p in ep)
    per_expert = 3 * a2a.dims.hidden * a2a.dims.ffn * 2
    assert lower_bound(a2a, 0).received == stage0 + stage1 + experts * per_expert


def test_plan_errors_name_the_number_at_fault():
    cfg = L.tiny_cfg()
    with pytest.raises(InvalidLayoutError, match="layer_list_sums_to_num_layers"):
        build_sync_plan(cfg, L.training_layout(), L.rollout_layout(), (2, 2))
    with pytest.raises(InvalidLayoutError, match="same_world_size"):
        from verl_patches.reshard.layout import RolloutLayout

        build_sync_plan(cfg, L.training_layout(), RolloutLayout(4, 2, 2), L.LAYER_LIST)


def test_tp_merge_inverts_the_converters_split():
    src = L.DictSource({"g": torch.randn(8, 3), "u": torch.randn(8, 3), "r": torch.randn(8, 3), "c": torch.randn(3, 8)})
    gate_up = [tl.build_gate_up(src, ["g", "u"], 4, t) for t in range(4)]
    assert torch.equal(merge_tp("gate_up", gate_up), torch.cat([src.get("g"), src.get("u")]))
    assert torch.equal(merge_tp("tp_rows", [tl.build_tp_rows(src, ["r"], 4, t) for t in range(4)]), src.get("r"))
    assert torch.equal(merge_tp("tp_cols", [tl.build_tp_cols(src, ["c"], 4, t) for t in range(4)]), src.get("c"))
    assert full_shape("gate_up", (4, 3), 4) == (16, 3) and full_shape("tp_cols", (3, 2), 4) == (3, 8)


def test_to_hf_splits_mla_fused_qkv_and_gate_up():
    cfg = L.tiny_cfg()
    rows = cfg["q_lora_rank"] + cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]
    qkv = torch.randn(rows, 4)
    (qa, a), (kva, b) = to_hf("concat_rows", qkv, ["qa", "kva"], cfg)
    assert torch.equal(torch.cat([a, b]), qkv) and a.shape[0] == cfg["q_lora_rank"]
    assert kind_of("decoder.layers.3.self_attention.linear_qkv.weight") == "concat_rows"
    assert kind_of("decoder.layers.3.mlp.router.expert_bias") == "replicated"
    with pytest.raises(ValueError, match="cannot be split"):
        to_hf("concat_rows", torch.randn(rows + 1, 4), ["qa", "kva"], cfg)
