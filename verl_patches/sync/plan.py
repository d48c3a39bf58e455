"""The whole-model weight-sync plan: which collective carries each parameter (pure; vendor items E2, E3, C4).

Three routes, in this fixed global order (every rank walks the same list, so collectives line up):

1. *Lockstep* (E3): parameters every stage has at the same local index with the same shape
   (`verl_patches.reshard.pp_plan`), TP-merged inside the stage and exchanged with one all-gather per bucket
   over the pipeline group.
2. *Legacy* (E3's "the rest"): every other non-expert parameter (embedding, final norm, output layer, the
   layers past the shortest stage, dense-vs-MoE mismatches): the owning stage broadcasts each TP shard over
   the pipeline group, then every stage merges the TP shards - one HF tensor at a time, straight into its
   final buffer (`verl_patches.sync.generator`), so no rank holds more than the tensor it hands over.
3. *Experts* (E2): grouped-GEMM ``weight1``/``weight2`` of every MoE layer, routed straight from the owning
   stage to the rollout ranks that serve each expert (`verl_patches.reshard.ep_plan`, world group); a rank
   never receives an expert it does not serve.

`SyncPath.ALL_GATHER` (``NO_ALL_TO_ALL_RESHARD=1``) is the vendor's fallback kept for comparison: every
non-expert parameter takes route 2, and experts are broadcast over PP then all-gathered over the TP×EP group.

`lower_bound` states, per rank, what any sync with vLLM's ``load_weights`` interface (whole HF tensors)
must do: receive every byte of every tensor it loads that it does not already hold, and materialise at
least the largest such tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch

from verl_patches.reshard.ep_plan import ExpertDims, ExpertReshardPlan, ExpertWeight, plan_expert_reshard
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.reshard.pp_plan import ParamSpec, PpGatherPlan, plan_pp_gather, validate_layer_list
from verl_patches.sync.param_table import SyncParam, moe_layers, stage_tables, weights_layout
from verl_patches.weights.layout import ParallelLayout, validate_layout


class SyncPath(str, Enum):
    ALL_TO_ALL = "all-to-all"
    ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class SyncPlan:
    cfg: Mapping[str, Any]
    training: MegatronLayout
    rollout: RolloutLayout
    layout: ParallelLayout
    counts: tuple[int, ...]
    path: SyncPath
    stages: tuple[tuple[SyncParam, ...], ...]
    pp_plan: PpGatherPlan | None  # None on the all-gather path
    legacy: tuple[SyncParam, ...]  # route 2, in global order
    moe: tuple[tuple[int, int, int], ...]  # (global layer, stage, local layer)
    expert_plans: tuple[ExpertReshardPlan, ...]  # per stage (holder = that stage)
    dims: ExpertDims
    dtype: torch.dtype

    @property
    def num_experts(self) -> int:
        return int(self.cfg["n_routed_experts"])

    def param(self, stage: int, local_name: str) -> SyncParam:
        for p in self.stages[stage]:
            if p.local_name == local_name:
                return p
        raise KeyError(f"stage {stage} has no parameter {local_name!r}")

    def lockstep_params(self, stage: int) -> tuple[SyncParam, ...]:
        if self.pp_plan is None:
            return ()
        return tuple(self.param(stage, n) for n in self.pp_plan.eligible[stage])


def build_sync_plan(
    cfg: Mapping[str, Any],
    training: MegatronLayout,
    rollout: RolloutLayout,
    num_layer_list: tuple[int, ...] | None = None,
    path: SyncPath = SyncPath.ALL_TO_ALL,
    bucket_bytes: int | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> SyncPlan:
    """Plan the sync of a DeepSeek-V3 model; every layout error names the number at fault."""
    if training.cp != 1:
        raise InvalidLayoutError("no_context_parallel", f"weight sync supports cp=1, got cp={training.cp}")
    if training.world_size != rollout.world_size:
        raise InvalidLayoutError(
            "same_world_size", f"training world {training.world_size} != rollout world {rollout.world_size}"
        )
    counts = tuple(num_layer_list) if num_layer_list else None
    if counts is not None:
        validate_layer_list(counts, training.pp, int(cfg["num_hidden_layers"]))
    layout = weights_layout(training.tp, training.pp, training.ep, counts)
    validate_layout(layout, cfg)
    counts = counts or (int(cfg["num_hidden_layers"]) // training.pp,) * training.pp
    stages = stage_tables(cfg, layout, dtype)
    path = SyncPath(path)
    if path is SyncPath.ALL_TO_ALL:
        specs = [[ParamSpec(p.local_name, p.full_shape, str(p.dtype)) for p in s] for s in stages]
        pp_plan = plan_pp_gather(specs, counts, bucket_bytes=bucket_bytes)
        chosen = [set(names) for names in pp_plan.eligible]
        legacy = tuple(p for s, params in enumerate(stages) for p in params if p.local_name not in chosen[s])
    else:
        pp_plan = None
        legacy = tuple(p for params in stages for p in params)
    num_experts = int(cfg["n_routed_experts"])
    expert_plans = tuple(
        plan_expert_reshard(training, rollout, num_experts, holder_stage=s) for s in range(training.pp)
    )
    dims = ExpertDims(hidden=int(cfg["hidden_size"]), ffn=int(cfg["moe_intermediate_size"]))
    return SyncPlan(
        dict(cfg),
        training,
        rollout,
        layout,
        counts,
        path,
        stages,
        pp_plan,
        legacy,
        moe_layers(cfg, counts),
        expert_plans,
        dims,
        dtype,
    )


@dataclass(frozen=True)
class LowerBound:
    received: int  # bytes this rank must receive
    peak_extra: int  # bytes of the largest tensor it must materialise


def lower_bound(plan: SyncPlan, rank: int) -> LowerBound:
    """Per-rank lower bound of any sync that hands vLLM whole HF tensors (see the module docstring)."""
    stage = plan.training.pp_rank(rank)
    received, peak = 0, 0
    for params in plan.stages:
        for p in params:
            held = p.local_bytes if p.stage == stage else 0
            if p.is_tp_split or held == 0:
                received += p.full_bytes - held
                # a held TP shard is not the whole tensor: the loader needs every HF tensor whole
                hf_bytes = p.full_bytes // len(p.hf_names)
                peak = max(peak, hf_bytes)
            # replicated on the owning stage: a view of what the rank holds, nothing to move
    item = plan.dtype.itemsize
    per_expert = sum(plan.dims.expert_numel(kind) for kind in ExpertWeight) * item
    for _layer, layer_stage, _local in plan.moe:
        ep = plan.expert_plans[layer_stage]
        held_experts, need = ep.held(rank), ep.needed(rank)
        missing = [e for e in need if e not in held_experts]
        received += len(missing) * per_expert
        if missing:
            # one projection of one expert (gate, up or down) is the smallest tensor vLLM loads
            peak = max(peak, plan.dims.hidden * plan.dims.ffn * item)
    return LowerBound(received, peak)
