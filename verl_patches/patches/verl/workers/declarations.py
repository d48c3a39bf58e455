"""Patches of verl.workers.*."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import ALL_DEVICES, CPU_ONLY, wrap

_FSDP_INIT_FINGERPRINTS = {
    "ActorRolloutRefWorker": "sha256:97220b079393b8d8",
    "CriticWorker": "sha256:cf5690aa0c808fef",
    "RewardModelWorker": "sha256:16e861c2376cb9da",
}


_SWITCH_TIMING = [
    wrap(
        name=f"timing.{cls}.enter",
        target=f"verl.workers.sharding_manager.{mod}:{cls}.__enter__",
        fingerprint=fp,
        by="verl_patches.patches.verl.workers.step_timing:timed_enter",
        vendor_item="local",
        reason="time the train->rollout weight switch for the step table (the vendor's 'train/infer switch')",
        devices=ALL_DEVICES,
    )
    for mod, cls, fp in (
        ("base", "BaseShardingManager", "sha256:01653bceb0b83281"),
        ("fsdp_vllm", "FSDPVLLMShardingManager", "sha256:a3fc3f0236405454"),
        ("megatron_vllm", "MegatronVLLMShardingManager", "sha256:c5e30c64f0c3e023"),
    )
] + [
    wrap(
        name=f"timing.{mod}.generate_sequences",
        target=f"verl.workers.{mod}:ActorRolloutRefWorker.generate_sequences",
        fingerprint=fp,
        by="verl_patches.patches.verl.workers.step_timing:report_switch_time",
        vendor_item="local",
        reason="hand the measured weight-switch time to the driver with the generated batch",
        devices=ALL_DEVICES,
    )
    # the innermost layer of megatron_workers' generate_sequences stack: the D2D and progress wraps
    # (megatron_declarations) come later in the catalog and wrap it
    for mod, fp in (
        ("fsdp_workers", "sha256:933f386de9ab97b7"),
        ("megatron_workers", pinned("verl.workers.megatron_workers:ActorRolloutRefWorker.generate_sequences")),
    )
]

PATCHES = _SWITCH_TIMING + [
    wrap(
        name=f"cpu.verl.fsdp_workers.{cls}.gloo_process_group",
        target=f"verl.workers.fsdp_workers:{cls}.__init__",
        fingerprint=fp,
        by="verl_patches.patches.verl.workers.fsdp_workers:init_process_group_first",
        vendor_item="local",
        reason="verl's FSDP workers pick an hccl process group when CUDA is absent; the CPU needs gloo",
        devices=CPU_ONLY,
    )
    for cls, fp in _FSDP_INIT_FINGERPRINTS.items()
]
