"""Memory calls: the "device" is the host, so totals come from host memory; allocated bytes are those of npu
tensors (the npu device emulation's counters, 0 before it is loaded). Nothing is cached: reserved is allocated.

VERL_PATCHES_NPU_MEMORY_GIB gives the emulated device a capacity of its own (GiB) instead of the host's total: a
vLLM engine sizes its KV cache as a share of the device (gpu_memory_utilization), and a share of a whole host,
written with zeros, is more memory than a host that runs other processes can give (vllm-ascend's own tests keep
upstream's 0.9)."""

import os

import torch

from verl_patches.base import env_registry
from verl_patches.npu_emulation.device.build import loaded_extension

CAPACITY_ENV = "VERL_PATCHES_NPU_MEMORY_GIB"


def _host_memory() -> tuple[int, int]:
    try:
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        vm = psutil.virtual_memory()
        return vm.available, vm.total
    except ImportError:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return pages, pages


def mem_get_info(device=None) -> tuple[int, int]:
    """(free, total) of the emulated device: its capacity is the host's total memory, and what is used is what
    this process holds in npu tensors. Not the host's available memory: that moves with every other process,
    and vllm-ascend's KV-cache sizing asserts free memory fell while it profiled (it would rise at random)."""
    capacity_gib = env_registry.number(CAPACITY_ENV)  # 0 (the host's) when unset
    total = int(capacity_gib * (1 << 30)) if capacity_gib else _host_memory()[1]
    return max(0, total - memory_allocated(device)), total


def empty_cache() -> None:
    return None


def _index(device) -> int:
    """The device index a memory call names; -1 for the current device."""
    if device is None:
        return -1
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device):
        return -1 if device.index is None else device.index
    return int(device)


def memory_allocated(device=None) -> int:
    ext = loaded_extension()
    return ext.memory_allocated(_index(device)) if ext is not None else 0


def max_memory_allocated(device=None) -> int:
    ext = loaded_extension()
    return ext.max_memory_allocated(_index(device)) if ext is not None else 0


def memory_reserved(device=None) -> int:
    return memory_allocated(device)


def max_memory_reserved(device=None) -> int:
    return max_memory_allocated(device)


def memory_stats(device=None) -> dict:
    current, peak = memory_allocated(device), max_memory_allocated(device)
    return {
        "allocated_bytes.all.current": current,
        "allocated_bytes.all.peak": peak,
        "reserved_bytes.all.current": current,
        "reserved_bytes.all.peak": peak,
    }


def reset_peak_memory_stats(device=None) -> None:
    ext = loaded_extension()
    if ext is not None:
        ext.reset_peak_memory_stats(_index(device))


def reset_max_memory_allocated(device=None) -> None:
    reset_peak_memory_stats(device)


def set_per_process_memory_fraction(fraction: float, device=None) -> None:
    return None


class NPUPluggableAllocator:
    """Accepted and ignored: the CPU allocator stays in charge."""

    def __init__(self, path_to_so_file: str, alloc_fn_name: str, free_fn_name: str) -> None:
        self.path, self.alloc_fn_name, self.free_fn_name = path_to_so_file, alloc_fn_name, free_fn_name

    def allocator(self):
        return None


def change_current_allocator(allocator) -> None:
    return None
