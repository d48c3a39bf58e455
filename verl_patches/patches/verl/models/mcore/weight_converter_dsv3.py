"""G10: the Megatron → HF name converter for MindSpeed-LLM's DeepSeek-V3, for verl's weight-converter registry.

verl's own ``McoreToHFWeightConverterDpskv3`` expects Megatron ≥ 0.12's MLA names (``linear_q_down_proj``,
``linear_kv_up_proj``...) and per-expert ``linear_fc1.weight{e}``; MindSpeed-LLM's model has a fused
``linear_qkv`` (q_a ‖ kv_a), ``linear_qb``/``linear_kvb``, ``q_layernorm``/``k_layernorm`` and grouped-GEMM
``experts.weight1``/``weight2``. The table is `verl_patches.weights.names` (shared with the offline
converters); tensor splits are `verl_patches.sync.convert`.

``convert_param(name, params)`` takes a *global* Megatron name and either the merged tensor (one) or the
tensors already split the way the HF names are (as verl's ``convert_qkv_gate_up_by_simple_split`` does):
``linear_qkv`` 1 or 2, ``linear_fc1`` 1 or 2, ``experts.weight1`` 2·E (gate, up per expert), ``weight2`` E.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verl_patches.patches.verl.models.registry_entries import with_deepseek_v3
from verl_patches.sync.convert import to_hf
from verl_patches.sync.param_table import kind_of
from verl_patches.weights.names import mcore_to_hf_names


class McoreToHFWeightConverterDeepseekV3:
    def __init__(self, hf_config: Any, mcore_config: Any = None) -> None:
        self.hf_config = hf_config
        self.mcore_config = mcore_config
        cfg = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(hf_config)
        self._cfg = cfg
        self.num_experts = int(cfg["n_routed_experts"])

    def convert_param(
        self, name: str, params_one_group: Sequence[torch.Tensor]
    ) -> tuple[list[str], list[torch.Tensor]]:
        names = mcore_to_hf_names(name, self.num_experts)
        params = list(params_one_group)
        if len(params) == len(names):
            return names, params
        if len(params) == 1:
            pairs = to_hf(kind_of(name), params[0], names, self._cfg)
            return [n for n, _ in pairs], [t for _, t in pairs]
        raise ValueError(
            f"{name}: {len(params)} tensors given, it maps to {len(names)} HF tensors "
            f"({names[:3]}{'...' if len(names) > 3 else ''})"
        )


def with_deepseek_v3_converter(registry: Any) -> dict:
    """verl's MODEL_WEIGHT_CONVERTER_REGISTRY with the DeepSeek-V3 entry replaced by ours."""

    return with_deepseek_v3(registry, McoreToHFWeightConverterDeepseekV3)
