"""The sync's inputs read from a live run: Megatron's shards, layouts and groups, vLLM's rollout layout.

Thin adapters around ``megatron.core.parallel_state`` (passed in as ``mpu``, so tests can hand a fake) and
the rollout's parallel settings. The plan is cached per (config, layouts, path): it depends on nothing else.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import torch
import torch.distributed as dist

from verl_patches.base import env_registry
from verl_patches.base.env_flags import EnvError
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout
from verl_patches.sync.generator import SyncGroups
from verl_patches.sync.path import active_sync_path
from verl_patches.sync.plan import SyncPath, SyncPlan, build_sync_plan

EXTRA_STATE = "_extra_state"


def layer_list_from(value: Any) -> tuple[int, ...] | None:
    """MindSpeed's ``num_layer_list`` as given (``"7,7,8"``, a list, or None) → a tuple of ints."""
    if value is None or value == "":
        return None
    items = value.split(",") if isinstance(value, str) else list(value)
    try:
        return tuple(int(str(x).strip()) for x in items)
    except ValueError:
        raise InvalidLayoutError("num_layer_list_integers", f"num_layer_list {value!r} must list integers") from None


def strip_module_prefix(name: str) -> str:
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def local_state(models: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """This rank's named shards: parameters plus state-dict-only tensors such as ``router.expert_bias``.

    ``models`` are unwrapped Megatron model chunks; only one chunk (no virtual pipeline) is supported.
    """
    if len(models) != 1:
        raise InvalidLayoutError(
            "no_virtual_pipeline", f"weight sync supports one model chunk per rank, got {len(models)} (VPP)"
        )
    model = models[0]
    out = {strip_module_prefix(n): p.data for n, p in model.named_parameters()}
    for name, t in model.state_dict(keep_vars=True).items():
        name = strip_module_prefix(name)
        if EXTRA_STATE not in name and name not in out and isinstance(t, torch.Tensor):
            out[name] = t.data
    return out


def megatron_layout(mpu: Any, rank: int, world_size: int) -> MegatronLayout:
    """The training layout, checked against the ranks Megatron actually assigned to this process."""
    layout = MegatronLayout(
        world_size=world_size,
        tp=mpu.get_tensor_model_parallel_world_size(),
        pp=mpu.get_pipeline_model_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        cp=mpu.get_context_parallel_world_size(),
    )
    c = layout.coords(rank)
    found = (
        mpu.get_tensor_model_parallel_rank(),
        mpu.get_pipeline_model_parallel_rank(),
        mpu.get_expert_model_parallel_rank(),
    )
    if (c.tp, c.pp, c.ep) != found:
        raise InvalidLayoutError(
            "megatron_order_tp_cp_ep_dp_pp",
            f"rank {rank}: Megatron reports (tp, pp, ep) = {found}, the order tp-cp-ep-dp-pp gives "
            f"{(c.tp, c.pp, c.ep)}; the weight sync needs Megatron's default rank order",
        )
    return layout


def rollout_layout(world_size: int, rollout_tp: int, environ: Mapping[str, str] | None = None) -> RolloutLayout:
    """vLLM's layout: ``rollout_tp`` ranks per engine, ``VLLM_DP_SIZE`` engines per expert-parallel instance."""
    try:
        dp = env_registry.integer("VLLM_DP_SIZE", environ)
    except EnvError as err:
        raise InvalidLayoutError("vllm_dp_size_integer", str(err)) from None
    return RolloutLayout(world_size=world_size, tp=rollout_tp, dp_per_instance=dp)


def megatron_groups(mpu: Any) -> SyncGroups:
    return SyncGroups(
        tp=mpu.get_tensor_model_parallel_group(),
        pp=mpu.get_pipeline_model_parallel_group(),
        tp_ep=mpu.get_tensor_and_expert_parallel_group(),
    )


@lru_cache(maxsize=4)
def _cached_plan(
    cfg_json: str,
    training: MegatronLayout,
    rollout: RolloutLayout,
    layer_list: tuple[int, ...] | None,
    path: str,
    dtype: torch.dtype,
) -> SyncPlan:
    return build_sync_plan(json.loads(cfg_json), training, rollout, layer_list, SyncPath(path), dtype=dtype)


def sync_plan(
    hf_config: Mapping[str, Any],
    training: MegatronLayout,
    rollout: RolloutLayout,
    layer_list: tuple[int, ...] | None,
    dtype: torch.dtype = torch.bfloat16,
    path: str | None = None,
) -> SyncPlan:
    keys = json.dumps(
        {k: v for k, v in hf_config.items() if isinstance(v, (int, float, str, bool, type(None)))}, sort_keys=True
    )
    return _cached_plan(keys, training, rollout, layer_list, path or active_sync_path(), dtype)


def model_dtype(local: Mapping[str, torch.Tensor]) -> torch.dtype:
    """The dtype of the model's weights (the router bias is float32 whatever the model dtype)."""
    for name, t in local.items():
        if name.endswith("input_layernorm.weight") or name.endswith("linear_proj.weight"):
            return t.dtype
    return next(iter(local.values())).dtype


def hf_config_dict(model_config: Any) -> dict[str, Any]:
    return model_config.to_dict() if hasattr(model_config, "to_dict") else dict(model_config)


def world() -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()
