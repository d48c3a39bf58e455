"""D1 and a DeepSeek-V3-shaped checkpoint without rope_scaling (issue 24, item 6): MindSpeed-LLM sizes the rotary
embedding from kv_channels = hidden_size / heads unless its yarn path recomputes it from qk_rope_head_dim, so such
a model crashed the Megatron engine in its first forward pass (`size of tensor a (8) must match ... (16)`) while HF
ran it. D1 refuses it with one line before MindSpeed-LLM starts; a config where both sizes agree still
translates."""

from __future__ import annotations

import pytest

from tests.train_engine.test_translate import DSV3, a3_config
from verl_patches.train_engine.translate import TranslationError, translate_verl_train_configs_to_megatron


def test_no_yarn_with_a_rope_head_dim_unlike_hidden_over_heads_is_refused_in_one_line() -> None:
    hf = {k: v for k, v in DSV3.items() if k != "rope_scaling"}
    with pytest.raises(TranslationError) as e:
        translate_verl_train_configs_to_megatron(a3_config(), hf)
    message = str(e.value)
    assert "\n" not in message and "rope_scaling" in message
    assert "hidden_size / num_attention_heads = 56" in message and "qk_rope_head_dim = 64" in message


def test_no_yarn_with_matching_sizes_and_with_yarn_translate() -> None:
    matching = {**{k: v for k, v in DSV3.items() if k != "rope_scaling"}, "qk_rope_head_dim": 7168 // 128}
    args = translate_verl_train_configs_to_megatron(a3_config(), matching)
    assert args["rope_scaling_type"] is None
    assert translate_verl_train_configs_to_megatron(a3_config(), DSV3)["rope_scaling_type"] == "yarn"
