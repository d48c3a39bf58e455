"""Memory calls: the "device" is the host, so totals come from host memory and allocator stats are 0."""

import os


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
    return _host_memory()


def empty_cache() -> None:
    return None


def memory_allocated(device=None) -> int:
    return 0


def max_memory_allocated(device=None) -> int:
    return 0


def memory_reserved(device=None) -> int:
    return 0


def max_memory_reserved(device=None) -> int:
    return 0


def memory_stats(device=None) -> dict:
    return {}


def reset_max_memory_allocated(device=None) -> None:
    return None


def reset_peak_memory_stats(device=None) -> None:
    return None


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
