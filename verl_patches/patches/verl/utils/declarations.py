"""Patches of verl.utils.*."""

from verl_patches.patching.declaration import Kind, Patch


def _cpu_get_torch_device():
    from verl_patches.patches.verl.utils.device import get_torch_device

    return get_torch_device


PATCHES = [
    Patch(
        name="cpu.verl.utils.device.get_torch_device",
        target="verl.utils.device:get_torch_device",
        kind=Kind.REPLACE,
        fingerprint="sha256:4c3b3451742ac75e",
        replacement=_cpu_get_torch_device,
        vendor_item="local",
        reason="torch.cpu lacks the memory, RNG and device calls verl makes on its device module",
        devices=("cpu",),
    ),
]
