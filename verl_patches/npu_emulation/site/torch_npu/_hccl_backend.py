"""An `hccl` process-group backend on a CPU host, carried by gloo (the real torch_npu registers HCCL when
imported; vllm-ascend's worker asks torch.distributed for "hccl"). Collectives run on CPU tensors."""

import torch.distributed as dist


def _create_gloo_as_hccl(store, group_rank, group_size, timeout):
    return dist.ProcessGroupGloo(store, group_rank, group_size, timeout)


def register() -> None:
    if "hccl" not in dist.Backend.backend_list:
        dist.Backend.register_backend("hccl", _create_gloo_as_hccl, devices=["cpu"])


register()
