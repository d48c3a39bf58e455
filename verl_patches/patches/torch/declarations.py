"""Patches of torch internals that assume an accelerator."""

from verl_patches.patching.declaration import CPU_ONLY, replace

PATCHES = [
    replace(
        name="cpu.torch.fsdp.sync_module_states_on_cpu",
        target="torch.distributed.fsdp._init_utils:_check_module_states_for_sync_module_states",
        fingerprint="sha256:b4ea82ab27844d89",
        by="verl_patches.patches.torch.fsdp_init:allow_cpu_module_states",
        vendor_item="local",
        reason="verl builds FSDP with sync_module_states=True, which FSDP refuses for CPU tensors; "
        "gloo broadcasts them",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.torch.fsdp.no_pinned_param_offload",
        target="torch.distributed.fsdp.api:CPUOffload",
        fingerprint="sha256:9a4f75bc3a72db75",
        built_by="verl_patches.patches.torch.fsdp_init:cpu_host_cpu_offload",
        vendor_item="local",
        reason="verl forces CPUOffload(offload_params=True) on the ref policy; FSDP then pins memory, which "
        "needs an accelerator, and on a CPU host the parameters are in host memory already",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.torch.fsdp2.no_pinned_offload_policy",
        target="torch.distributed._composable.fsdp._fsdp_api:CPUOffloadPolicy",  # torch 2.5.1's FSDP2 home
        fingerprint="sha256:977cb60a38e38ea0",
        built_by="verl_patches.patches.torch.fsdp_init:cpu_host_cpu_offload_policy",
        vendor_item="local",
        reason="verl's FSDP2 path uses CPUOffloadPolicy(pin_memory=True) for the ref policy; "
        "pinning needs an accelerator",
        devices=CPU_ONLY,
    ),
]
