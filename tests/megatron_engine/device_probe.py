"""One rank (argv: mode = ours | upstream_order): the Megatron worker's process group on the torch_npu CPU
emulation with the visible devices and ranks the test sets in the environment. Prints one JSON line: the
device every rank selected, or the error."""

import json
import sys

from verl_patches.npu_emulation import install_on_cpu_host

install_on_cpu_host()
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch_npu  # noqa: E402,F401  (the emulation: torch.npu, the hccl backend)

from verl_patches.patches.verl.workers.megatron_workers import init_process_group  # noqa: E402

try:
    if sys.argv[1] == "ours":
        init_process_group("npu")
    else:  # what bring_up did before: the group without choosing a device
        dist.init_process_group(backend="hccl")
    devices = [None] * dist.get_world_size()
    dist.all_gather_object(devices, torch.npu.current_device())
    print(json.dumps({"devices": devices, "backend": dist.get_backend()}))
except RuntimeError as e:
    print(json.dumps({"error": str(e)}))
