"""G3: ``megatron.core.transformer.MLATransformerConfig``, which core_r0.8.0 lacks.

verl v0.4.0's ``config_converter`` imports it at module level, so without it nothing of ``verl.models.mcore``
imports. On this stack MLA is built by MindSpeed-LLM from its global arguments, not from this class; the
shim carries the MLA fields newer Megatron has so a config built from it reads the same, and nothing more.
Its attention dimensions default to DeepSeek-V3's, the one model this stack trains, read from the one
description of it (`reshard.model_dims.DEEPSEEK_V3`; Megatron's own defaults, e.g. q_lora_rank 512, are no
model's); the rope settings keep Megatron's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron.core.transformer.transformer_config import TransformerConfig

from verl_patches.reshard.model_dims import DEEPSEEK_V3


@dataclass
class MLATransformerConfig(TransformerConfig):
    """TransformerConfig plus the multi-latent-attention fields of Megatron core >= 0.10."""

    multi_latent_attention: bool = True
    q_lora_rank: int | None = DEEPSEEK_V3.q_lora_rank
    kv_lora_rank: int = DEEPSEEK_V3.kv_lora_rank
    qk_head_dim: int = DEEPSEEK_V3.qk_nope_head_dim
    qk_pos_emb_head_dim: int = DEEPSEEK_V3.qk_rope_head_dim
    v_head_dim: int = DEEPSEEK_V3.v_head_dim
    rope_type: str = "yarn"
    rotary_base: float = 10000
    rotary_percent: float = 1.0
    rotary_scaling_factor: float = 40
    max_position_embeddings: int = 4096
    beta_fast: float = 32
    beta_slow: float = 1
    mscale: float = 0.707
    mscale_all_dim: float = 0.707
