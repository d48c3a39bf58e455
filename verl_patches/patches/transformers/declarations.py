"""Patches of transformers (pinned by requirements, not by sources.lock)."""

from verl_patches.patching.declaration import CPU_ONLY, replace, wrap

PATCHES = [
    wrap(
        name="cpu.transformers.eager_attention_without_flash_attn",
        target="transformers.modeling_utils:PreTrainedModel._autoset_attn_implementation",
        fingerprint="sha256:65a9a89b8dead68c",
        by="verl_patches.patches.transformers.modeling_utils:eager_without_flash_attn",
        vendor_item="local",
        reason='verl forces attn_implementation="flash_attention_2"; flash-attn does not exist on the CPU',
        devices=CPU_ONLY,
    ),
    replace(
        name="transformers.deepseek_v3.router_masks_unselected_groups",
        target="transformers.models.deepseek_v3.modeling_deepseek_v3:DeepseekV3TopkRouter.get_topk_indices",
        fingerprint="sha256:d29a92fc4ffd92d8",
        by="verl_patches.patches.transformers.deepseek_v3_router:topk_indices_with_masked_groups",
        vendor_item="local",
        reason="HF's DeepseekV3 router fills the groups it did not select with 0.0, so a negative biased score "
        "(sigmoid + e_score_correction_bias) loses to an expert of an unselected group; DeepSeek-V3's own Gate "
        "(inference/model.py, since its fix 1398800), MindSpeed-LLM's router and npu_moe_gating_top_k mask them "
        "with -inf. HF is the numerical reference of training and rollout: it must route as they do",
        rebind=False,  # a method: the class attribute is the one reference
    ),
]
