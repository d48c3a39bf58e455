"""Patches of verl.models.mcore and the Megatron symbols it needs, for DeepSeek-V3 on core_r0.8.0 + MindSpeed-LLM."""

from verl_patches.patching.declaration import ABSENT, replace, wrap

_M = "verl_patches.patches.verl.models"

PATCHES = [
    replace(
        name="verl.models.mla_transformer_config",
        target="megatron.core.transformer:MLATransformerConfig",
        fingerprint=ABSENT,
        by=f"{_M}.mla_config:MLATransformerConfig",
        vendor_item="G3",
        reason="verl's config_converter imports MLATransformerConfig, which core_r0.8.0 lacks",
    ),
    replace(
        name="verl.models.get_gpt_decoder_block_spec",
        target="megatron.core.models.gpt.gpt_layer_specs:get_gpt_decoder_block_spec",
        fingerprint=ABSENT,
        by=f"{_M}.specs:get_gpt_decoder_block_spec",
        vendor_item="G4",
        reason="verl's model_initializer imports it (Megatron >= 0.11); "
        "a call says which model families this stack supports",
    ),
    replace(
        name="verl.models.get_gpt_mtp_block_spec",
        target="megatron.core.models.gpt.gpt_layer_specs:get_gpt_mtp_block_spec",
        fingerprint=ABSENT,
        by=f"{_M}.specs:get_gpt_mtp_block_spec",
        vendor_item="G4",
        reason="verl's model_initializer imports the MTP spec builder (Megatron >= 0.12); MTP is not trained here",
    ),
    replace(
        name="verl.models.packed_seq_params_padded",
        target="megatron.core.packed_seq_params:PackedSeqParams",
        fingerprint="sha256:77ca41cde4efbd33",
        by=f"{_M}.packed_seq:PackedSeqParams",
        vendor_item="G5",
        reason="verl's packed-sequence helpers pass cu_seqlens_{q,kv}_padded, fields core_r0.8.0's dataclass lacks",
    ),
    wrap(
        name="verl.models.dpskv3_config_converter",
        target="verl.models.mcore.registry:MODEL_CONFIG_CONVERTER_REGISTRY",
        fingerprint="sha256:e0c7bf10a86acd73",
        fingerprint_of=(
            "verl.models.mcore.registry:MODEL_CONFIG_CONVERTER_REGISTRY",
            "verl.models.mcore.config_converter:hf_to_mcore_config_dpskv3",
        ),
        by=f"{_M}.registry_entries:config_converters",
        vendor_item="G8",
        reason="DeepSeek-V3's transformer config is MindSpeed-LLM's (from the Megatron arguments), checked against "
        "the HF config, with override_transformer_config honoured",
        rebind=False,
    ),
    wrap(
        name="verl.models.dpskv3_model_initializer",
        target="verl.models.mcore.registry:MODEL_INITIALIZER_REGISTRY",
        fingerprint="sha256:50c343d862dccc4e",
        fingerprint_of=(
            "verl.models.mcore.registry:MODEL_INITIALIZER_REGISTRY",
            "verl.models.mcore.model_initializer:DeepseekV3Model",
        ),
        by=f"{_M}.registry_entries:model_initializers",
        vendor_item="G9",
        reason="build DeepSeek-V3 from MindSpeed-LLM's deepseek layer spec (MLA, dense then MoE, shared and "
        "grouped-GEMM experts, router bias); verl's needs Megatron >= 0.12 spec builders and MTP",
        rebind=False,
    ),
    wrap(
        name="verl.models.dpskv3_forward",
        target="verl.models.mcore.registry:MODEL_FORWARD_REGISTRY",
        fingerprint="sha256:7d531650b518eb5e",
        fingerprint_of=(
            "verl.models.mcore.registry:MODEL_FORWARD_REGISTRY",
            "verl.models.mcore.model_forward:gptmodel_forward",
        ),
        by=f"{_M}.registry_entries:forward_fns",
        vendor_item="G11",
        reason="non-packed forward with the NPU flash-attention mask and the actor's logits processor "
        "(upstream's non-packed branch refuses it)",
        rebind=False,
    ),
    replace(
        name="verl.models.cross_entropy_logits_max_no_fp32_copy",
        target="megatron.core.tensor_parallel.cross_entropy:VocabParallelCrossEntropy.calculate_logits_max",
        fingerprint="sha256:f259ffe22521e5f3",
        built_by=f"{_M}.cross_entropy:logits_max_staticmethod",
        vendor_item="G6",
        reason="the max of the logits in their own dtype (exact), returned in fp32: no full fp32 copy of the "
        "logits for verl's log-probs",
    ),
    replace(
        name="verl.models.cross_entropy_shift_out_of_place",
        target="megatron.core.tensor_parallel.cross_entropy:VocabParallelCrossEntropy.calculate_predicted_logits",
        fingerprint="sha256:81b7e99d18685abc",
        built_by=f"{_M}.cross_entropy:predicted_logits_staticmethod",
        vendor_item="G7",
        reason="logits - max into one fp32 tensor (exp in place on it): upstream's in-place shift would round "
        "bf16 logits once G6 stops copying them",
    ),
]
