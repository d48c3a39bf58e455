"""The declared patches of the weight sync: G10 converter table, uneven-PP offsets (C4/C5), B1 dispatch,
the DP rank map (C2), and the Megatron adapters."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tests.sync import sync_testlib as L
from verl_patches.patches.verl.models.mcore.weight_converter_dsv3 import McoreToHFWeightConverterDeepseekV3
from verl_patches.patches.verl.single_controller.dispatch import with_dp_rank_map
from verl_patches.patches.verl.utils.megatron_utils import get_transformer_layer_offset, layer_offset
from verl_patches.reshard.dp_plan import DpRankMap, plan_dp_relayout
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout
from verl_patches.sync import megatron_source as src
from verl_patches.sync.param_table import stage_tables, weights_layout
from verl_patches.weights.hf_schema import hf_layer_shapes
from verl_patches.worker_calls.meta_keys import DP_RANKS_META_KEY

LIST = (7, 7, 8, 8, 8, 8, 8, 7)


# ------------------------------------------------------------------------------------------------ G10


@pytest.mark.parametrize("global_layer", [0, 3])  # dense layer 0, MoE layer 3
def test_g10_maps_every_megatron_tensor_of_a_layer_onto_the_hf_key_set(global_layer):
    cfg = L.tiny_cfg()
    conv = McoreToHFWeightConverterDeepseekV3(cfg)
    layout = weights_layout(L.TP, L.PP, L.EP, L.LAYER_LIST)
    stage = 0 if global_layer < 2 else 1
    offset = 0 if stage == 0 else 2
    shapes = hf_layer_shapes(cfg, global_layer)
    names = []
    for p in stage_tables(cfg, layout)[stage]:
        if p.global_name.startswith(f"decoder.layers.{global_layer}."):
            got, tensors = conv.convert_param(p.global_name, [torch.zeros(p.full_shape, dtype=p.dtype)])
            assert [tuple(t.shape) for t in tensors] == [shapes[n] for n in got], p.global_name
            names += got
    if global_layer >= cfg["first_k_dense_replace"]:
        e = cfg["n_routed_experts"]
        names += conv.convert_param(f"decoder.layers.{global_layer}.mlp.experts.weight1", [torch.zeros(1)] * 2 * e)[0]
        names += conv.convert_param(f"decoder.layers.{global_layer}.mlp.experts.weight2", [torch.zeros(1)] * e)[0]
        assert f"model.layers.{global_layer}.mlp.gate.e_score_correction_bias" in names
    assert sorted(names) == sorted(shapes) and len(names) == len(set(names)) and offset >= 0


def test_g10_refuses_a_wrong_tensor_count_and_keeps_split_params():
    conv = McoreToHFWeightConverterDeepseekV3(L.tiny_cfg())
    gate, up = torch.zeros(2, 3), torch.ones(2, 3)
    names, ts = conv.convert_param("decoder.layers.0.mlp.linear_fc1.weight", [gate, up])
    assert names == ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"] and ts[1] is up
    with pytest.raises(ValueError, match="3 tensors given"):
        conv.convert_param("decoder.layers.0.mlp.linear_fc1.weight", [gate, up, up])
    assert conv.convert_param("output_layer.weight", [gate])[0] == ["lm_head.weight"]


def test_g10_replaces_the_deepseek_v3_entry_of_the_registry_only():
    import enum

    from verl_patches.patches.verl.models.mcore.weight_converter_dsv3 import with_deepseek_v3_converter

    # verl.models.mcore.registry needs core >= 0.11 to import (the train-engine patches provide that); its
    # registry is keyed by an Enum whose values are the architecture names, as here
    Supported = enum.Enum("SupportedModel", {"LLAMA": "LlamaForCausalLM", "DEEPSEEK_V3": "DeepseekV3ForCausalLM"})
    registry = {Supported.LLAMA: object, Supported.DEEPSEEK_V3: int}
    patched = with_deepseek_v3_converter(registry)
    assert patched[Supported.DEEPSEEK_V3] is McoreToHFWeightConverterDeepseekV3
    assert patched[Supported.LLAMA] is object and registry[Supported.DEEPSEEK_V3] is int


# ------------------------------------------------------------------------------------------------ C4 / C5


def test_layer_offsets_follow_the_uneven_list():
    assert [layer_offset(s, 61, 8, LIST) for s in range(8)] == [0, 7, 14, 22, 30, 38, 46, 54]
    assert [layer_offset(s, 8, 4, None) for s in range(4)] == [0, 2, 4, 6]
    with pytest.raises(InvalidLayoutError, match="layer_list_matches_model"):
        layer_offset(0, 60, 8, LIST)
    with pytest.raises(InvalidLayoutError, match="even_split_or_layer_list"):
        layer_offset(1, 61, 8, None)


def test_normalize_model_name_uses_the_patched_offset(monkeypatch):
    import verl.utils.megatron_utils as mu
    from verl.utils.model import normalize_model_name

    monkeypatch.setattr(mu, "get_transformer_layer_offset", get_transformer_layer_offset)
    cfg = SimpleNamespace(pipeline_model_parallel_size=8, num_layers=61, num_layer_list="7,7,8,8,8,8,8,7")
    assert (
        normalize_model_name("decoder.layers.0.mlp.router.weight", 2, None, cfg)
        == "decoder.layers.14.mlp.router.weight"
    )
    assert (
        normalize_model_name("decoder.layers.6.input_layernorm.weight", 7, None, cfg)
        == "decoder.layers.60.input_layernorm.weight"
    )
    with pytest.raises(InvalidLayoutError, match="no_virtual_pipeline"):
        get_transformer_layer_offset(1, 1, cfg)


# ------------------------------------------------------------------------------------------------ B1 / C2


class FakeWorkerGroup:
    def __init__(self, layout: MegatronLayout):
        self.layout, self.world_size, self.dp_size = layout, layout.world_size, layout.dp

    def get_megatron_rank_info(self, rank):
        return SimpleNamespace(dp_rank=self.layout.dp_rank(rank))


def test_megatron_compute_proto_dispatch_carries_the_dp_rank_map():
    from verl.protocol import DataProto
    from verl.single_controller.base.decorator import Dispatch

    seen = []
    fns = {
        Dispatch.MEGATRON_COMPUTE_PROTO: {"dispatch_fn": lambda wg, *a, **k: seen.append(a) or a, "collect_fn": "c"},
        Dispatch.DP_COMPUTE_PROTO: {"dispatch_fn": "d", "collect_fn": "c"},
    }
    lookup = with_dp_rank_map(lambda dispatch_mode: fns[dispatch_mode])
    assert lookup(dispatch_mode=Dispatch.DP_COMPUTE_PROTO) is fns[Dispatch.DP_COMPUTE_PROTO]
    mode = lookup(dispatch_mode=Dispatch.MEGATRON_COMPUTE_PROTO)
    assert mode["collect_fn"] == "c"
    layout = MegatronLayout(8, tp=2, pp=2)
    data = DataProto.from_dict(tensors={"x": torch.arange(4)})
    mode["dispatch_fn"](FakeWorkerGroup(layout), data)
    assert seen[0][0].meta_info[DP_RANKS_META_KEY] == [layout.dp_rank(r) for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_dp_rank_map_plans_like_the_layout_it_came_from():
    for layout in (MegatronLayout(8, tp=2, pp=2), MegatronLayout(8, tp=2, pp=1, ep=2), MegatronLayout(8, tp=1, pp=2)):
        rmap = DpRankMap(tuple(layout.dp_rank(r) for r in range(8)))
        a, b = plan_dp_relayout(layout, [3] * 8), plan_dp_relayout(rmap, [3] * 8)
        assert a.all_exchanges() == b.all_exchanges()
    with pytest.raises(InvalidLayoutError, match="dp_rank_map_balanced"):
        DpRankMap((0, 0, 1))


# ------------------------------------------------------------------------------------------------ adapters


class FakeMpu:
    def __init__(self, layout, rank):
        c = layout.coords(rank)
        self.sizes, self.ranks = (layout.tp, layout.pp, layout.ep, layout.cp), (c.tp, c.pp, c.ep)

    def get_tensor_model_parallel_world_size(self):
        return self.sizes[0]

    def get_pipeline_model_parallel_world_size(self):
        return self.sizes[1]

    def get_expert_model_parallel_world_size(self):
        return self.sizes[2]

    def get_context_parallel_world_size(self):
        return self.sizes[3]

    def get_tensor_model_parallel_rank(self):
        return self.ranks[0]

    def get_pipeline_model_parallel_rank(self):
        return self.ranks[1]

    def get_expert_model_parallel_rank(self):
        return self.ranks[2]


def test_megatron_layout_is_checked_against_megatrons_own_ranks():
    layout = L.training_layout()
    for rank in range(8):
        assert src.megatron_layout(FakeMpu(layout, rank), rank, 8) == layout
    with pytest.raises(InvalidLayoutError, match="megatron_order_tp_cp_ep_dp_pp"):
        src.megatron_layout(FakeMpu(layout, 1), 2, 8)


def test_local_state_includes_state_dict_only_tensors_like_the_router_bias():
    class Router(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(4, 2))
            self.register_buffer("expert_bias", torch.zeros(4))

    m = torch.nn.Module()
    m.module = torch.nn.Module()
    m.module.router = Router()
    got = src.local_state([m])
    assert set(got) == {"router.weight", "router.expert_bias"}
    with pytest.raises(InvalidLayoutError, match="no_virtual_pipeline"):
        src.local_state([m, m])


def test_rollout_layout_and_layer_list_parsing():
    assert src.rollout_layout(256, 2, {"VLLM_DP_SIZE": "64"}).num_instances == 2
    with pytest.raises(InvalidLayoutError, match="vllm_dp_size_integer"):
        src.rollout_layout(8, 2, {"VLLM_DP_SIZE": "x"})
    assert src.layer_list_from("7, 7,8") == (7, 7, 8) and src.layer_list_from(None) is None
    assert src.layer_list_from([2, 3]) == (2, 3)


def test_the_declared_patches_are_in_place_in_a_fresh_interpreter():
    import subprocess
    import sys
    from pathlib import Path

    code = """
import verl_patches.prelude_patch
import verl.utils.megatron_utils as mu
from verl.single_controller.base.decorator import Dispatch, get_predefined_dispatch_fn
fn = get_predefined_dispatch_fn(dispatch_mode=Dispatch.MEGATRON_COMPUTE_PROTO)["dispatch_fn"]
print(mu.per_tensor_generator.__module__, mu.get_transformer_layer_offset.__module__, fn.__wrapped__.__name__)
"""
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    # the MEGATRON_COMPUTE_PROTO dispatch is our annotating wrapper around upstream's function
    assert r.stdout.split() == ["verl_patches.patches.verl.utils.megatron_utils"] * 2 + [
        "dispatch_megatron_compute_data_proto"
    ], r.stdout
