"""E1: the Megatron → rollout sharding manager. Its logic lives in `verl_patches.sync.sharding_manager`."""

from verl_patches.patching.declaration import ALL_DEVICES, replace

PATCHES = [
    replace(
        name="verl.sharding_manager.megatron_rollout",
        target="verl.workers.sharding_manager.megatron_vllm:MegatronVLLMShardingManager",
        fingerprint="sha256:44c6df83bd31908f",
        by="verl_patches.sync.sharding_manager:MegatronRolloutShardingManager",
        vendor_item="E1",
        reason="drive the rollout's onload/offload and KV free instead of vLLM sleep/wake, stream our reshard "
        "into load_weights, rebuild the MLA absorbed matrices after every load",
        devices=ALL_DEVICES,
    ),
]
