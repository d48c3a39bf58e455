"""Patches of vllm.v1.engine.*."""

from verl_patches.patching.declaration import replace

PATCHES = [
    replace(
        name="vllm.v1.engine.core.EngineCore._initialize_kv_caches",
        target="vllm.v1.engine.core:EngineCore._initialize_kv_caches",
        fingerprint="sha256:8868ebb64007459b",
        by="verl_patches.rollout.kv_cache_config:initialize_kv_caches_keeping_configs",
        vendor_item="F3",
        reason="keep the per-worker KV cache configs of the first init so every re-init after a free reuses "
        "them (same block count as the scheduler's, no re-profiling)",
    ),
]
