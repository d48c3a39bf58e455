"""Patches of verl.models.mcore for DeepSeek-V3 on megatron core_r0.8.0 + MindSpeed-LLM (vendor items G3-G9, G11)."""
