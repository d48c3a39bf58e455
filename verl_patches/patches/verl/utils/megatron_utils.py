"""Replacements in ``verl.utils.megatron_utils`` for the DeepSeek-V3 weight sync (vendor items C4, C5, E2, E3).

* `per_tensor_generator`: upstream broadcasts every parameter over PP, all-gathers it over TP, and for
  grouped-GEMM experts concatenates ``weight1``/``weight2`` along the wrong axis for the rollout (C4). Ours
  streams `verl_patches.sync.generator` (lockstep PP exchange, expert all-to-all-v to the serving rollout
  rank, or the all-gather path under ``NO_ALL_TO_ALL_RESHARD=1``). The weight converter argument is
  accepted for signature compatibility: names come from the DeepSeek-V3 table (G10) directly.
* `get_transformer_layer_offset`: upstream reads core ≥ 0.11's ``num_layers_in_first/last_pipeline_stage``;
  MindSpeed's uneven split is ``num_layer_list`` (``--num-layer-list 7,7,8,...``). Upstream's
  ``normalize_model_name`` imports this function at call time, so it maps local layer indices to global
  ones with the uneven list too (C5) without a patch of its own.

(Upstream v0.4.0 already offloads ``expert_parallel_buffers`` in ``offload_megatron_model_to_cpu``, the
other half of the vendor's C4; nothing to change there.)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.pp_plan import layer_offsets
from verl_patches.sync import megatron_source as src
from verl_patches.sync.generator import iter_rollout_weights
from verl_patches.sync.megatron_source import layer_list_from


def num_layer_list(config: Any) -> tuple[int, ...] | None:
    """The uneven layer list from the transformer config, else from MindSpeed's parsed arguments."""
    found = layer_list_from(getattr(config, "num_layer_list", None))
    if found is not None:
        return found
    try:
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.training import get_args

        args = get_args()
    except Exception:  # megatron.training absent or its arguments not parsed: no uneven list
        return None
    return layer_list_from(getattr(args, "num_layer_list", None))


def layer_offset(pipeline_rank: int, num_layers: int, pp: int, layer_list: Sequence[int] | None) -> int:
    """Global index of stage ``pipeline_rank``'s first layer (pure)."""
    if layer_list:
        if len(layer_list) != pp or sum(layer_list) != num_layers:
            raise InvalidLayoutError(
                "layer_list_matches_model",
                f"num_layer_list {list(layer_list)} does not split {num_layers} layers over {pp} pipeline stages",
            )
        return layer_offsets(layer_list)[pipeline_rank]
    if num_layers % pp:
        raise InvalidLayoutError(
            "even_split_or_layer_list", f"{num_layers} layers do not split evenly over {pp} stages; set num_layer_list"
        )
    return pipeline_rank * (num_layers // pp)


def get_transformer_layer_offset(pipeline_rank: int, vp_rank: int | None, config: Any) -> int:
    if vp_rank not in (None, 0):
        raise InvalidLayoutError("no_virtual_pipeline", f"virtual pipeline rank {vp_rank}: VPP is not supported")
    pp = int(getattr(config, "pipeline_model_parallel_size", 1) or 1)
    if pp == 1:
        return 0
    return layer_offset(pipeline_rank, int(config.num_layers), pp, num_layer_list(config))


def per_tensor_generator(
    actor_module: Any,
    model_config: Any,
    weight_converter: Any,
    transformer_config: Any,
    layer_name_mapping: Any,
    convert_qkv_gate_up_by_simple_split: bool = True,
) -> Iterator[tuple[str, torch.Tensor]]:
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state as mpu

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.megatron_utils import unwrap_model

    # deferred: a patch applies while upstream is still importing; vLLM is read at call time
    from vllm.distributed import parallel_state as vllm_ps

    rank, world = dist.get_rank(), dist.get_world_size()
    local = src.local_state([unwrap_model(m) for m in actor_module])
    training = src.megatron_layout(mpu, rank, world)
    rollout = src.rollout_layout(world, vllm_ps.get_tensor_model_parallel_world_size())
    plan = src.sync_plan(
        src.hf_config_dict(model_config), training, rollout, num_layer_list(transformer_config), src.model_dtype(local)
    )
    return iter_rollout_weights(plan, rank, local, src.megatron_groups(mpu))
