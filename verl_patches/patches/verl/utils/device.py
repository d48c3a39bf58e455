"""CPU port of verl.utils.device: a device module for the CPU with the calls verl makes on it.

verl calls `get_torch_device().<fn>()` for memory statistics, RNG state, seeding and device
selection. On CUDA/NPU that is torch.cuda / torch.npu; on the CPU verl returns torch.cpu, which lacks
most of them. Memory figures report the process's resident memory, the CPU's counterpart.
"""

from __future__ import annotations

from typing import Any

import torch


class CpuDeviceModule:
    """torch.cpu, plus what torch.cuda has and verl uses. Unknown names fall through to torch.cpu."""

    _peak_rss = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def _rss() -> int:
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        rss = psutil.Process().memory_info().rss
        CpuDeviceModule._peak_rss = max(CpuDeviceModule._peak_rss, rss)
        return rss

    def current_device(self) -> str:
        return "cpu"

    def device_count(self) -> int:
        return 1

    def set_device(self, device: Any) -> None:
        return None

    def is_available(self) -> bool:
        return True

    def get_device_name(self, device: Any = None) -> str:
        return "cpu"

    def memory_allocated(self, device: Any = None) -> int:
        return self._rss()

    memory_reserved = memory_allocated

    def max_memory_allocated(self, device: Any = None) -> int:
        self._rss()
        return CpuDeviceModule._peak_rss

    max_memory_reserved = max_memory_allocated

    def reset_peak_memory_stats(self, device: Any = None) -> None:
        CpuDeviceModule._peak_rss = 0

    def mem_get_info(self, device: Any = None) -> tuple[int, int]:
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total

    def empty_cache(self) -> None:
        return None

    def synchronize(self, device: Any = None) -> None:
        return None

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    manual_seed_all = manual_seed


CPU_DEVICE_MODULE = CpuDeviceModule()


def get_torch_device() -> CpuDeviceModule:
    """Replacement for verl.utils.device.get_torch_device on the CPU."""
    return CPU_DEVICE_MODULE


class TorchWithCpuDevice:
    """The `torch` module as verl.utils.fsdp_utils sees it on a CPU host: `torch.cuda` is the CPU device
    module (FSDP2 helpers there call torch.cuda.current_device() / empty_cache() directly); every
    other attribute is torch's own."""

    cuda = CPU_DEVICE_MODULE

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def torch_for_fsdp_utils() -> TorchWithCpuDevice:
    return TorchWithCpuDevice()
