"""`get_hccl_comm_name(rank)` on the backend of an `hccl` group on a CPU host.

The real torch_npu's ProcessGroupHCCL names its communicator; vllm-ascend reads that name from the EP group's
npu backend (`device_group._get_backend(torch.device("npu")).get_hccl_comm_name(rank)`) and hands it to the MC2
ops, which find their group by it. Our `hccl` backend is gloo's, which has no such method, so vllm-ascend would
catch the AttributeError and pass no name. Here gloo's backend class gets the method: it finds the process
group this backend serves and names it through verl_patches.npu_emulation.hccl_names, where the emulated MC2
ops look it up. Every rank derives the same name from the group's torch name.
"""

import torch
import torch.distributed as dist

from verl_patches.npu_emulation import hccl_names


def _group_of(backend) -> dist.ProcessGroup:
    for group in list(dist.distributed_c10d._world.pg_map):
        for device in ("npu", "cpu"):
            try:
                served = group._get_backend(torch.device(device))
            except RuntimeError:  # the group has no backend for that device
                continue
            if served is backend:
                return group
    raise RuntimeError("get_hccl_comm_name: this backend serves no process group of this process")


def get_hccl_comm_name(self, rank: int) -> str:
    return hccl_names.name_for_group(_group_of(self))


def register() -> None:
    if not hasattr(dist.ProcessGroupGloo, "get_hccl_comm_name"):
        dist.ProcessGroupGloo.get_hccl_comm_name = get_hccl_comm_name
