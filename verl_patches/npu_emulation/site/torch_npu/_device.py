"""Register the "npu" device name (PyTorch's privateuse1 backend) and torch.npu, once per process."""

import torch

_done = False


def register() -> None:
    global _done
    if _done:
        return
    name = torch._C._get_privateuse1_backend_name()
    if name == "privateuseone":
        torch.utils.rename_privateuse1_backend("npu")
    elif name != "npu":
        raise RuntimeError(f"torch_npu CPU emulation: the privateuse1 backend is already named {name!r}")
    if not hasattr(torch, "npu"):
        from torch_npu import npu

        torch._register_device_module("npu", npu)
    _done = True
