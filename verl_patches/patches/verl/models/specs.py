"""G4: the layer-spec builders verl's ``model_initializer`` imports from newer Megatron.

core_r0.8.0 has neither ``get_gpt_decoder_block_spec`` nor ``get_gpt_mtp_block_spec``. DeepSeek-V3 is built
from MindSpeed-LLM's own spec (G9), so these exist only to let verl's module import; a call means a model
family we do not support on this stack, and says so instead of failing on a missing name deep inside.
"""

from __future__ import annotations

from typing import Any, NoReturn


class UnsupportedOnCoreR080(NotImplementedError):
    """A verl model path that needs a newer Megatron core than the pinned core_r0.8.0."""


def get_gpt_decoder_block_spec(config: Any, use_transformer_engine: bool = False, **_: Any) -> NoReturn:
    raise UnsupportedOnCoreR080(
        "get_gpt_decoder_block_spec is a Megatron core >= 0.11 API; on core_r0.8.0 + MindSpeed-LLM only "
        "DeepseekV3ForCausalLM is supported (its layers come from mindspeed_llm's deepseek spec)"
    )


def get_gpt_mtp_block_spec(config: Any, spec: Any = None, use_transformer_engine: bool = False, **_: Any) -> NoReturn:
    raise UnsupportedOnCoreR080(
        "multi-token prediction (MTP) is not supported for training on core_r0.8.0: set "
        "num_nextn_predict_layers to 0 in the model config (verl_patches/scripts/make_config.py does)"
    )
