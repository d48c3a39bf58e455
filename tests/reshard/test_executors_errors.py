"""Executor input checks that fire before any collective (no process group needed)."""

from __future__ import annotations

import pytest
import torch

from verl_patches.reshard.dp_plan import plan_dp_relayout
from verl_patches.reshard.ep_plan import ExpertDims, ExpertWeight, plan_expert_reshard
from verl_patches.reshard.errors import PlanMismatchError
from verl_patches.reshard.executors import gather_pipeline_params, relayout_rows, reshard_expert_weight
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.reshard.pp_plan import ParamSpec, plan_pp_gather

TRAINING = MegatronLayout(8, tp=2, pp=2, ep=2)


def test_relayout_rejects_a_chunk_of_the_wrong_size():
    plan = plan_dp_relayout(TRAINING, [2] * 8)
    with pytest.raises(PlanMismatchError, match="rank 3: local chunk has 3 rows, the plan expects 2"):
        relayout_rows(plan, 3, torch.zeros(3, 4))


def test_expert_reshard_rejects_a_weight_of_the_wrong_shape():
    plan = plan_expert_reshard(TRAINING, RolloutLayout(8, 2, 4), 8, holder_stage=1)
    dims = ExpertDims(hidden=4, ffn=3)
    with pytest.raises(PlanMismatchError, match=r"rank 4: weight1 has shape \(4, 6\), the plan expects \(4, 12\)"):
        reshard_expert_weight(plan, 4, ExpertWeight.WEIGHT1, dims, torch.zeros(4, 6))
    with pytest.raises(PlanMismatchError, match="holds no expert of this layer: pass dtype"):
        reshard_expert_weight(plan, 0, ExpertWeight.WEIGHT1, dims, None)


def test_pipeline_gather_rejects_missing_or_misshapen_parameters():
    stages = [[ParamSpec("decoder.layers.0.w", (2, 3))], [ParamSpec("decoder.layers.0.w", (2, 3))]]
    plan = plan_pp_gather(stages, [1, 1])
    with pytest.raises(PlanMismatchError, match="was not passed"):
        next(gather_pipeline_params(plan, 0, {}, None))
    with pytest.raises(PlanMismatchError, match=r"is \(3, 2\) torch.bfloat16, the plan expects \(2, 3\)"):
        next(gather_pipeline_params(plan, 1, {"decoder.layers.0.w": torch.zeros(3, 2, dtype=torch.bfloat16)}, None))
