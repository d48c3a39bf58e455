"""Weight-sync patches of verl.utils.megatron_utils (C4, C5, E2, E3); logic in ``megatron_utils.py`` beside."""

from verl_patches.patching.declaration import ALL_DEVICES, replace

_M = "verl_patches.patches.verl.utils.megatron_utils"

PATCHES = [
    replace(
        name="verl.megatron_utils.per_tensor_generator",
        target="verl.utils.megatron_utils:per_tensor_generator",
        fingerprint="sha256:4bf616b21447a6a8",
        fingerprint_of=(
            "verl.utils.megatron_utils:per_tensor_generator",
            "verl.utils.megatron_utils:default_tp_concat_fn",
        ),
        by=f"{_M}:per_tensor_generator",
        vendor_item="E2,E3,C4",
        reason="DeepSeek-V3 grouped-GEMM experts routed by all-to-all-v to the serving rollout rank (correct "
        "weight1/weight2 layout), lockstep PP exchange, uneven PP; NO_ALL_TO_ALL_RESHARD=1 keeps all-gather",
        devices=ALL_DEVICES,
    ),
    replace(
        name="verl.megatron_utils.layer_offset_num_layer_list",
        target="verl.utils.megatron_utils:get_transformer_layer_offset",
        fingerprint="sha256:16d72a91f514ce5c",
        fingerprint_of=(
            "verl.utils.megatron_utils:get_transformer_layer_offset",
            "verl.utils.model:normalize_model_name",
        ),
        by=f"{_M}:get_transformer_layer_offset",
        vendor_item="C4,C5",
        reason="MindSpeed's uneven num_layer_list (core 0.8 lacks num_layers_in_first/last_pipeline_stage); "
        "normalize_model_name resolves it at call time, so global layer names follow the list",
        devices=ALL_DEVICES,
    ),
]
