"""Register the "npu" device name (PyTorch's privateuse1 backend) and torch.npu, once per process."""

import torch

_done = False


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    """What PyTorch asks a registered privateuse1 backend: torch.distributed.barrier() and
    torch.accelerator query it once the backend is named (without hooks they raise "Please register
    PrivateUse1HooksInterface"); a gloo group still picks the CPU for its barrier."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):  # noqa: ANN201 (a torch._C enum)
        return torch._C._autograd.DeviceType.PrivateUse1


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
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    _done = True
