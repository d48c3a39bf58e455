"""G10: DeepSeek-V3 (MindSpeed-LLM) Megatron → HF weight converter in verl's registry."""

from verl_patches.patching.declaration import ALL_DEVICES, wrap

PATCHES = [
    wrap(
        name="verl.models.dpskv3_weight_converter",
        target="verl.models.mcore.registry:MODEL_WEIGHT_CONVERTER_REGISTRY",
        fingerprint="sha256:a773f1ea11dd71ba",
        fingerprint_of=(
            "verl.models.mcore.registry:MODEL_WEIGHT_CONVERTER_REGISTRY",
            "verl.models.mcore.weight_converter:McoreToHFWeightConverterDpskv3",
        ),
        by="verl_patches.patches.verl.models.mcore.weight_converter_dsv3:with_deepseek_v3_converter",
        vendor_item="G10",
        reason="MindSpeed-LLM's DeepSeek-V3 names (fused linear_qkv, linear_qb/kvb, grouped-GEMM weight1/weight2, "
        "router.expert_bias) mapped to HF; verl's converter expects Megatron >= 0.12 MLA names",
        devices=ALL_DEVICES,
        rebind=False,
    ),
]
