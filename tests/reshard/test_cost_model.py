"""Cost model on DeepSeek-V3 dimensions: the vendor's 14 GB → 0.0547 GB, our plan at the lower bound."""

from __future__ import annotations

import pytest

from verl_patches.reshard.cost_model import (
    GIB,
    ep_allgather_cost,
    ep_lower_bound,
    ep_plan_cost,
    ep_vendor_alltoallv_cost,
    expert_unit_bytes,
    pp_lower_bound,
    pp_plan_cost,
    pp_vendor_cost,
)
from verl_patches.reshard.ep_plan import ExpertDims, ExpertWeight, plan_expert_reshard
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import RolloutLayout, production_rollout_layout, production_training_layout
from verl_patches.reshard.model_dims import (
    DEEPSEEK_V3_CONFIG,
    PRODUCTION_LAYER_LIST,
    ModelDims,
    deepseek_v3_stage_params,
)
from verl_patches.reshard.pp_plan import plan_pp_gather

V3 = ModelDims.from_hf_config(DEEPSEEK_V3_CONFIG)
EXPERT = ExpertDims(V3.hidden, V3.moe_ffn)
W1 = ExpertWeight.WEIGHT1


def test_one_weight1_expert_is_0_0547_gib():
    assert expert_unit_bytes(EXPERT, W1) == 7168 * 2 * 2048 * 2
    assert round(expert_unit_bytes(EXPERT, W1) / GIB, 4) == 0.0547
    assert expert_unit_bytes(EXPERT, ExpertWeight.WEIGHT2) * 2 == expert_unit_bytes(EXPERT, W1)


def test_vendor_all_gather_is_14_gib_and_ours_is_one_expert():
    training, rollout = production_training_layout(), production_rollout_layout(128)
    gather = ep_allgather_cost(training, 256, EXPERT, W1)
    assert round(gather.max_peak_extra / GIB, 1) == 14.0
    assert gather.max_received == 31 * 8 * expert_unit_bytes(EXPERT, W1)
    plan = plan_expert_reshard(training, rollout, 256, holder_stage=3)
    ours = ep_plan_cost(plan, EXPERT, W1)
    bound = ep_lower_bound(training, rollout, 256, EXPERT, W1, holder_stage=3)
    assert ours.max_peak_extra == bound.max_peak_extra == expert_unit_bytes(EXPERT, W1)
    assert round(ours.max_peak_extra / GIB, 4) <= 0.0547
    assert ours.max_received == bound.max_received and ours.max_sent == bound.max_sent
    assert 1 - ours.max_peak_extra / gather.max_peak_extra > 0.996  # the vendor's −99.6 %


def test_two_instances_hold_two_experts_and_need_two_calls():
    training, rollout = production_training_layout(), production_rollout_layout(64)
    plan = plan_expert_reshard(training, rollout, 256, holder_stage=0)
    ours = ep_plan_cost(plan, EXPERT, W1)
    assert ours.max_peak_extra == 2 * expert_unit_bytes(EXPERT, W1) and ours.calls == 2
    single = ep_plan_cost(plan_expert_reshard(training, rollout, 256, 0, round_policy="single"), EXPERT, W1)
    assert single.calls == 1 and single.max_peak_extra > ours.max_peak_extra  # packed send buffer


def test_vendor_alltoallv_adds_the_pp_broadcast():
    training, rollout = production_training_layout(), production_rollout_layout(128)
    shard = 8 * expert_unit_bytes(EXPERT, W1)
    core = ep_vendor_alltoallv_cost(training, rollout, 256, EXPERT, W1)
    with_bcast = ep_vendor_alltoallv_cost(training, rollout, 256, EXPERT, W1, holder_stage=2)
    assert with_bcast.max_received == core.max_received + shard and with_bcast.calls == 2
    with pytest.raises(InvalidLayoutError):
        ep_vendor_alltoallv_cost(training, RolloutLayout(256, 2, 8), 256, EXPERT, W1)


def test_pipeline_exchange_costs():
    stages = [deepseek_v3_stage_params(V3, PRODUCTION_LAYER_LIST, s) for s in range(8)]
    plan = plan_pp_gather(stages, PRODUCTION_LAYER_LIST)
    ours, vendor, bound = pp_plan_cost(plan, 256), pp_vendor_cost(plan, 256), pp_lower_bound(plan, 256)
    assert ours.max_received == vendor.max_received == bound.max_received
    assert ours.calls * 5 < vendor.calls  # 256 MiB buckets: 19 calls instead of 144
