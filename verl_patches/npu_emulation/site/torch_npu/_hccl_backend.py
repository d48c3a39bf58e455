"""An `hccl` process-group backend on a CPU host, carried by gloo (the real torch_npu registers HCCL when
imported; vllm-ascend's worker asks torch.distributed for "hccl"). Registered for cpu and npu tensors, with one
gloo backend serving both: collectives on npu tensors reach gloo through the npu device emulation's c10d
kernels (verl_patches/npu_emulation/device/npu_device.cpp), which run gloo over the npu tensors' memory."""

import torch.distributed as dist


def _create_gloo_as_hccl(store, group_rank, group_size, timeout):
    # deferred: torch_npu imports this module; resolved at call time
    from torch_npu import npu

    if npu.device_count() > 1 and not npu.device_was_set():
        # HCCL binds the current device; without set_device every rank of a node would take device 0
        raise RuntimeError(
            f"hccl process group on rank {group_rank}: this process sees {npu.device_count()} NPUs "
            f"(ASCEND_RT_VISIBLE_DEVICES) and never called torch.npu.set_device"
        )
    return dist.ProcessGroupGloo(store, group_rank, group_size, timeout)


def register() -> None:
    if "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create_gloo_as_hccl, devices=["cpu", "npu"])


register()
