"""G1: provide `flash_attn.bert_padding` where flash-attn is not installed (NPU, CPU)."""

from verl_patches.patching.declaration import ALL_DEVICES, module_alias

PATCHES = [
    module_alias(
        name="flash_attn.bert_padding.pure_torch",
        target="flash_attn.bert_padding",
        provides="verl_patches.patches.flash_attn.bert_padding",
        vendor_item="G1",
        reason="verl's critic and workers import flash_attn.bert_padding unconditionally; flash-attn is CUDA-only",
        devices=ALL_DEVICES,
    ),
]
