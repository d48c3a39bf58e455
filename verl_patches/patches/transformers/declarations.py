"""Patches of transformers (pinned by requirements, not by sources.lock)."""

from verl_patches.patching.declaration import Kind, Patch, lazy_call


PATCHES = [
    Patch(
        name="cpu.transformers.eager_attention_without_flash_attn",
        target="transformers.modeling_utils:PreTrainedModel._autoset_attn_implementation",
        kind=Kind.WRAP,
        fingerprint="sha256:65a9a89b8dead68c",
        replacement=lazy_call("verl_patches.patches.transformers.modeling_utils:eager_without_flash_attn"),
        vendor_item="local",
        reason='verl forces attn_implementation="flash_attention_2"; flash-attn does not exist on the CPU',
        devices=("cpu",),
    ),
]
