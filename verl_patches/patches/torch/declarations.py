"""Patches of torch internals that assume an accelerator."""

from verl_patches.patching.declaration import Kind, Patch


def _allow_cpu_states():
    from verl_patches.patches.torch.fsdp_init import allow_cpu_module_states

    return allow_cpu_module_states


def _cpu_offload_cls():
    from verl_patches.patches.torch.fsdp_init import cpu_host_cpu_offload

    return cpu_host_cpu_offload()


PATCHES = [
    Patch(
        name="cpu.torch.fsdp.sync_module_states_on_cpu",
        target="torch.distributed.fsdp._init_utils:_check_module_states_for_sync_module_states",
        kind=Kind.REPLACE,
        fingerprint="sha256:9e0fe064f75c6c3a",
        replacement=_allow_cpu_states,
        vendor_item="local",
        reason="verl builds FSDP with sync_module_states=True, which FSDP refuses for CPU tensors; gloo broadcasts them",
        devices=("cpu",),
    ),
    Patch(
        name="cpu.torch.fsdp.no_pinned_param_offload",
        target="torch.distributed.fsdp.api:CPUOffload",
        kind=Kind.REPLACE,
        fingerprint="sha256:e5de29b358ad57a6",
        replacement=_cpu_offload_cls,
        vendor_item="local",
        reason="verl forces CPUOffload(offload_params=True) on the ref policy; FSDP then pins memory, which "
               "needs an accelerator, and on a CPU host the parameters are in host memory already",
        devices=("cpu",),
    ),
]
