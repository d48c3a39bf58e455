"""Which kind of device this host has (npu | cuda | cpu), and the one variable that overrides it.

`VERL_PATCHES_DEVICE` (npu, cuda or cpu) overrides every detection of ours: the setup of the sources (before
torch is installed), the CPU emulation of torch_npu, `verl_patches.device` and the preflight. The former second
name, ``VERL_OVERLAY_DEVICE``, is refused with the name to use, so a setting is never silently ignored by
half of the code.

`detect_host_device` looks at device files only (no torch: the sources are set up before it is installed);
`verl_patches.device.device_kind` asks torch and torch_npu once they are there, after `forced_device`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from verl_patches.base.env_flags import EnvError
from verl_patches.base.env_registry import REGISTRY, text

DEVICE_ENV = "VERL_PATCHES_DEVICE"  # npu | cuda | cpu: overrides detection (tests, odd hosts)
STALE_DEVICE_ENV = "VERL_OVERLAY_DEVICE"  # the former name the sources' setup read: refused, not ignored
DEVICE_KINDS = REGISTRY[DEVICE_ENV].choices  # npu, cuda, cpu
_NPU_FILES = ("/dev/davinci0", "/dev/davinci_manager")
_CUDA_FILES = ("/dev/nvidia0", "/dev/nvidiactl")


class DeviceSettingError(EnvError):
    """The device override is not one of npu, cuda, cpu, or is set under its former name; one line."""


def forced_device(environ: Mapping[str, str] | None = None) -> str | None:
    """The kind `VERL_PATCHES_DEVICE` forces, or None when it is unset or empty."""
    try:  # the registry refuses the former name, and a kind not in DEVICE_KINDS, in one line
        text(STALE_DEVICE_ENV, environ)
        return text(DEVICE_ENV, environ) or None
    except EnvError as err:
        raise DeviceSettingError(str(err)) from None


def detect_host_device(environ: Mapping[str, str] | None = None) -> str:
    """npu | cuda | cpu: the override when set, else by the device files of the host (no torch needed)."""
    forced = forced_device(environ)
    if forced:
        return forced
    if any(Path(p).exists() for p in _NPU_FILES):
        return "npu"
    if any(Path(p).exists() for p in _CUDA_FILES):
        return "cuda"
    return "cpu"
