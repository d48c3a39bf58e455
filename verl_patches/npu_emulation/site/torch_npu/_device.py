"""Register the "npu" device (PyTorch's privateuse1 backend) and torch.npu, once per process.

This folder is on sys.path only on a CPU host, so the device registered here is the emulated one: the C++
extension of verl_patches.npu_emulation.device (built once into the user's cache) gives npu tensors whose
memory is host memory, PyTorch's hooks for the backend, and npu collectives over the CPU (gloo) kernels.
"""

import torch

from verl_patches.npu_emulation.device.build import load_extension

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
        # deferred: torch_npu imports this module; resolved at call time
        from torch_npu import npu

        torch._register_device_module("npu", npu)
    load_extension().install()
    if not hasattr(torch.Tensor, "is_npu") and not hasattr(torch.Tensor, "npu"):
        # Tensor.npu() / is_npu / Module.npu() as torch_npu users expect; storages too, which torch.load
        # needs to put storages saved from npu tensors back on npu
        torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    _done = True
