"""Patches of vllm.v1.core.*."""

from verl_patches.patching.declaration import wrap

PATCHES = [
    wrap(
        name="vllm.v1.core.kv_cache_utils.get_num_blocks.override",
        target="vllm.v1.core.kv_cache_utils:get_num_blocks",
        fingerprint="sha256:5e5246160da34149",
        by="verl_patches.patches.vllm.v1.core.blocks_override:wrap_get_num_blocks",
        vendor_item="local",
        reason="vLLM 0.9.1 bug: num_gpu_blocks_override is logged as applied and then ignored; the tiny run "
        "sizes its KV cache with it (its emulated device memory is the host's); no effect unless it is set "
        "(the A3 profiles do not set it)",
        devices=("npu", "cpu"),
    ),
]
