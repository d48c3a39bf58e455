"""F3: the engine core's KV cache configs, computed once and reused every time the cache is re-created.

The rollout frees its KV cache after every generation (lifecycle.free_cache_engine) and re-creates it
before the next one. vLLM's `EngineCore._initialize_kv_caches` keeps the per-worker configs local, so a
re-init would have to profile memory again, and a different block count than the scheduler was built
with lets the two disagree about which blocks exist (memory trampling). This version does what vLLM
0.9.1 does at first init and also keeps the configs on the engine core as `kv_cache_configs`;
`reinitialize_kv_caches` then re-creates the cache from exactly those configs, without profiling, and
without resetting the sampling stream (the warm-up that follows re-seeds every RNG).
"""

from __future__ import annotations

from typing import Any

SAVED_ATTR = "kv_cache_configs"


class KVCacheConfigError(RuntimeError):
    pass


def initialize_kv_caches_keeping_configs(self: Any, vllm_config: Any) -> tuple[int, int, Any]:
    """Replacement of vllm.v1.engine.core.EngineCore._initialize_kv_caches (same result, configs kept)."""
    # vLLM's helpers are looked up on the engine-core module at call time, as upstream's body does.
    import vllm.v1.engine.core as core

    executor = self.model_executor
    specs = executor.get_kv_cache_specs()
    available = executor.determine_available_memory()
    if len(specs) != len(available):
        raise KVCacheConfigError(
            f"{len(specs)} workers reported KV cache specs but {len(available)} reported available memory"
        )
    configs = [core.get_kv_cache_config(vllm_config, spec, mem) for spec, mem in zip(specs, available)]
    core.unify_kv_cache_configs(configs)
    counts = sorted({c.num_blocks for c in configs})
    if len(counts) != 1:  # the scheduler serves every worker with one block table
        raise KVCacheConfigError(f"workers disagree on the number of KV cache blocks: {counts}")
    executor.initialize_from_config(configs)
    setattr(self, SAVED_ATTR, configs)
    return configs[0].num_blocks, 0, configs[0]


def saved_configs(engine_core: Any) -> list[Any]:
    configs = getattr(engine_core, SAVED_ATTR, None)
    if not configs:
        raise KVCacheConfigError(
            "the engine core has no saved KV cache configs: the F3 patch "
            "(vllm.v1.engine.core.EngineCore._initialize_kv_caches) was not active "
            "when the engine was built"
        )
    return configs


def reinitialize_kv_caches(engine_core: Any) -> int:
    """Re-create the KV cache from the configs saved at first init; returns the block count.

    vLLM's executor follows every `initialize_from_config` with `compile_or_warm_up_model`, whose last
    act on vllm-ascend's NPUWorker is `set_random_seed(model_config.seed)`: re-run each step, it would give
    every step the same sampling noise and overwrite a resumed run's restored stream. The process's RNG
    states (Python, NumPy, torch, the device's generator, which vLLM samples from on A3) are kept across
    the re-init, so the rollout's stream continues from where the last generation left it."""
    # lazy: that module loads numpy, torch; importing this one must not
    from verl_patches.checkpoint import rng

    configs = saved_configs(engine_core)
    before = rng.capture()
    try:
        engine_core.model_executor.initialize_from_config(configs)
    finally:
        rng.restore(before, "KV cache re-init")
    return configs[0].num_blocks
