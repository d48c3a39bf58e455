"""G9: DeepSeek-V3 for verl's model registry, built with MindSpeed-LLM's DeepSeek layer spec.

verl's own ``DeepseekV3Model`` calls Megatron >= 0.12 spec builders and passes ``mtp_block_spec`` to
``GPTModel``; core_r0.8.0 has neither. MindSpeed-LLM's ``deepseek_spec.layer_spec`` builds MLA, the dense
then MoE MLPs (``first_k_dense_replace``), the shared experts, grouped-GEMM routed experts and the router
with its expert bias, all configured from Megatron's global arguments; rotary/yarn scaling comes from those
arguments too, so no rope arguments are passed to ``GPTModel`` here.
"""

from __future__ import annotations

import importlib
from typing import Any

# MindSpeed-LLM's spec module reads the global arguments at import time: import it only when building.
DEEPSEEK_SPEC_MODULE = "mindspeed_llm.tasks.models.spec.deepseek_spec"


class DeepseekV3Model:
    """Drop-in for ``verl.models.mcore.model_initializer.DeepseekV3Model`` (same constructor and ``initialize``)."""

    def __init__(self, tfconfig: Any, hf_config: Any) -> None:
        self.tfconfig = tfconfig
        self.hf_config = hf_config

    def get_transformer_layer_spec(self) -> Any:
        return importlib.import_module(DEEPSEEK_SPEC_MODULE).layer_spec

    def get_rope_scaling_args(self) -> dict:
        return {}

    def initialize(
        self,
        pre_process: bool = True,
        post_process: bool = True,
        share_embeddings_and_output_weights: bool = False,
        value: bool = False,
        freeze_moe_router: bool = False,
        **_: Any,
    ) -> Any:
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core.models.gpt.gpt_model import GPTModel
        from megatron.training import get_args

        if value:
            raise NotImplementedError("a DeepSeek-V3 value model (critic) is not supported on this stack")
        args = get_args()
        model = GPTModel(
            config=self.tfconfig,
            transformer_layer_spec=self.get_transformer_layer_spec(),
            vocab_size=self.hf_config.vocab_size,
            max_sequence_length=args.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            share_embeddings_and_output_weights=share_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type,
            rotary_percent=args.rotary_percent,
            rotary_base=args.rotary_base,
            **self.get_rope_scaling_args(),
        )
        if freeze_moe_router:
            for layer in model.decoder.layers:
                router = getattr(layer.mlp, "router", None)
                if router is not None:
                    router.weight.requires_grad = False
        return model
