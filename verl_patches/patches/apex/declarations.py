"""G2: Megatron's apex FusedAdam becomes MindSpeed's fused AdamW on NPU."""

from verl_patches.patching.declaration import module_alias, replace

PATCHES = [
    module_alias(
        name="apex.optimizers.module_for_npu",
        target="apex.optimizers",
        provides="verl_patches.patches.apex.optimizers",
        vendor_item="G2",
        reason="apex is CUDA-only; Megatron imports FusedAdam from it",
        devices=("npu",),
    ),
    replace(
        name="apex.optimizers.FusedAdam_is_mindspeed_adamw",
        target="apex.optimizers:FusedAdam",
        fingerprint="",  # apex is not pinned by sources.lock: there is no pinned source to fingerprint
        built_by="verl_patches.patches.apex.optimizers:fused_adam_class",
        vendor_item="G2",
        reason="an installed apex for Ascend must still hand Megatron MindSpeed's fused NPU AdamW",
        devices=("npu",),
    ),
]
