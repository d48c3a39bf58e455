"""G3's MLATransformerConfig shim describes the model with the one dimensions type: its attention dimensions
are DeepSeek-V3's (`reshard.model_dims.DEEPSEEK_V3`, itself what the official config.json says)."""

from __future__ import annotations

import dataclasses

from verl_patches.reshard.model_dims import DEEPSEEK_V3, ModelDims
from verl_patches.weights.config import official_config

# Megatron's MLATransformerConfig field -> the ModelDims field holding the same dimension
MLA_FIELDS = {
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_head_dim": "qk_nope_head_dim",
    "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
}


def test_the_shims_attention_dimensions_are_deepseek_v3s() -> None:
    from verl_patches.patches.verl.models.mla_config import MLATransformerConfig

    defaults = {f.name: f.default for f in dataclasses.fields(MLATransformerConfig) if f.name in MLA_FIELDS}
    assert defaults == {field: getattr(DEEPSEEK_V3, dim) for field, dim in MLA_FIELDS.items()}
    assert defaults == {"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_head_dim": 128, "qk_pos_emb_head_dim": 64,
                        "v_head_dim": 128}  # fmt: skip


def test_the_one_description_is_the_official_configs() -> None:
    assert ModelDims.from_hf_config(official_config()) == DEEPSEEK_V3
