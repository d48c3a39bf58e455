"""The training side of the weight-sync tests: a tiny DeepSeek-V3 and each rank's Megatron shards.

The "training model" on each rank is exactly the state dict MindSpeed-LLM's GPTModel holds at TP2×PP2×EP2
with grouped GEMM, TP-extend-EP and an uneven layer list, as `verl_patches.weights.hf_to_mcore` builds it
from a Hugging Face checkpoint (held in memory here). The rollout layout is the A3 profile's (rollout TP2,
one vLLM instance whose EP spans every rank) scaled down to 8 ranks: EP8, one expert per rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from tests.megatron_engine.golden_assets import DictSource  # the in-memory TensorSource
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.sync.generator import SyncGroups
from verl_patches.sync.param_table import weights_layout
from verl_patches.weights.config import make_tiny_config
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.hf_to_mcore import build_rank_state_dict
from verl_patches.weights.layout import Rank
from verl_patches.weights.synthetic import random_tensor

WORLD = 8
TP, PP, EP = 2, 2, 2
LAYER_LIST = (2, 3)
ROLLOUT_TP, ROLLOUT_DP = 2, 4  # one instance, EP = 8


def tiny_cfg() -> dict[str, Any]:
    return make_tiny_config(
        256,
        num_hidden_layers=5,
        first_k_dense_replace=1,
        n_routed_experts=8,
        hidden_size=64,
        moe_intermediate_size=32,
        intermediate_size=128,
    )


def training_layout() -> MegatronLayout:
    return MegatronLayout(world_size=WORLD, tp=TP, pp=PP, ep=EP)


def rollout_layout(dp_per_instance: int = ROLLOUT_DP) -> RolloutLayout:
    return RolloutLayout(world_size=WORLD, tp=ROLLOUT_TP, dp_per_instance=dp_per_instance)


def hf_state(cfg: Mapping[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """A deterministic HF checkpoint (bf16, score-correction bias in float32)."""
    return {s.name: random_tensor(s, seed) for s in hf_tensor_specs(cfg)}


def weights_rank(training: MegatronLayout, rank: int) -> Rank:
    c = training.coords(rank)
    return Rank(tp=c.tp, pp=c.pp, ep=c.ep)


def rank_state(
    cfg: Mapping[str, Any], hf: Mapping[str, torch.Tensor], training: MegatronLayout, rank: int
) -> dict[str, torch.Tensor]:
    """The Megatron shards global rank ``rank`` holds (each tensor owns its storage, like a parameter)."""
    layout = weights_layout(training.tp, training.pp, training.ep, LAYER_LIST)
    sd = build_rank_state_dict(DictSource(hf), cfg, layout, weights_rank(training, rank))
    return {k: v.clone() for k, v in sd.items()}


def make_groups(training: MegatronLayout, rank: int) -> SyncGroups:
    """Create every TP, PP and TP×EP group (collective: all ranks, same order); return this rank's."""

    def mine(groups: list[list[int]]):
        out = None
        for g in groups:
            pg = dist.new_group(g)
            if rank in g:
                out = pg
        return out

    return SyncGroups(
        tp=mine(training.rank_groups("tp")),
        pp=mine(training.rank_groups("pp")),
        tp_ep=mine(training.rank_groups("tp-ep", independent_ep=True)),
    )
