"""Register the "npu" device name (PyTorch's privateuse1 backend) and torch.npu, once per process."""

import torch

_done = False


# torch 2.5.1 (the A3 pin) has no Python hook registration (`torch._C._acc` came later) and does not
# ask a renamed privateuse1 backend for hooks at barrier time; newer torch does, so register them there.
_ACC = getattr(torch._C, "_acc", None)
_HookBase = _ACC.PrivateUse1Hooks if _ACC is not None else object
_GuardBase = _ACC.DeviceGuard if _ACC is not None else object


class _Hooks(_HookBase):
    """What PyTorch asks a registered privateuse1 backend: torch.distributed.barrier() and
    torch.accelerator query it once the backend is named (without hooks they raise "Please register
    PrivateUse1HooksInterface"); a gloo group still picks the CPU for its barrier."""

    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(_GuardBase):
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
        # deferred: torch_npu imports this module; resolved at call time
        from torch_npu import npu

        torch._register_device_module("npu", npu)
    if _ACC is not None:
        _ACC.register_python_privateuseone_hook(_Hooks())
        _ACC.register_python_privateuseone_device_guard(_Guard())
    _done = True
