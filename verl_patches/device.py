"""The one place that knows whether this process runs on an Ascend NPU, a CUDA GPU or the CPU.

No other module of ours calls torch.cuda / torch.npu directly: they ask here, so the CPU profile and
the tests exercise the same code paths as the cluster, with only the leaf calls differing.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from dataclasses import dataclass
from typing import Any

from verl_patches.base import env_registry
from verl_patches.base.host_device import forced_device
from verl_patches.npu_emulation import is_emulation_path


@functools.lru_cache(maxsize=1)
def device_kind() -> str:
    """`VERL_PATCHES_DEVICE` when set, else npu if torch_npu is installed, else cuda if torch sees a GPU,
    else cpu.

    torch_npu is detected without importing it: importing it patches torch, which is its own
    caller's business (verl, vllm-ascend), not ours to trigger early.
    """
    forced = forced_device()
    if forced:
        return forced
    spec = importlib.util.find_spec("torch_npu")
    if spec is not None and not _is_cpu_emulation(getattr(spec, "origin", None)):
        return "npu"
    # lazy: asked only when neither the override nor torch_npu decides; the audit runs without torch
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _is_cpu_emulation(origin: str | None) -> bool:
    """Our CPU stand-in torch_npu (verl_patches.npu_emulation) does not make the host an NPU host."""

    return is_emulation_path(origin)


def dist_backend(kind: str | None = None) -> str:
    return {"npu": "hccl", "cuda": "nccl", "cpu": "gloo"}[kind or device_kind()]


def local_device_index(visible: int, environ: Any = None) -> int:
    """Which of the `visible` devices this process uses: the only one, else LOCAL_RANK (or RAY_LOCAL_RANK,
    verl's Ray worker group's index of the worker on its node). Raises one line naming what is missing."""
    env = os.environ if environ is None else environ
    if visible < 1:
        raise RuntimeError("no accelerator device is visible to this process")
    if visible == 1:
        return 0
    for name in ("LOCAL_RANK", "RAY_LOCAL_RANK"):
        if env_registry.is_set(name, env):
            index = env_registry.integer(name, env)
            if not 0 <= index < visible:
                raise RuntimeError(f"{name}={index} but this process sees {visible} devices")
            return index
    raise RuntimeError(
        f"this process sees {visible} devices and neither LOCAL_RANK nor RAY_LOCAL_RANK says which is its own"
    )


def set_local_device(kind: str | None = None, environ: Any = None) -> int | None:
    """Select this process's device (before its process group: HCCL/NCCL bind the current device); None on
    the CPU."""
    kind = kind or device_kind()
    if kind == "cpu":
        return None
    module = _npu_module() if kind == "npu" else _cuda_module()
    index = local_device_index(module.device_count(), environ)
    module.set_device(index)
    return index


def torch_device(index: int | None = None) -> Any:
    # lazy: the audit and setup import this module where torch may be absent
    import torch

    kind = device_kind()
    return torch.device(kind if index is None or kind == "cpu" else f"{kind}:{index}")


def _npu_module() -> Any:
    # lazy: the audit and setup import this module where torch may be absent
    import torch
    import torch_npu  # noqa: F401  (registers torch.npu)

    return torch.npu


def _cuda_module() -> Any:
    # lazy: the audit and setup import this module where torch may be absent
    import torch

    return torch.cuda


def accelerator_module() -> Any | None:
    """torch.npu or torch.cuda, or None on the CPU."""
    kind = device_kind()
    return _npu_module() if kind == "npu" else _cuda_module() if kind == "cuda" else None


def expandable_segments_enabled() -> bool:
    conf = os.environ.get("PYTORCH_NPU_ALLOC_CONF", "")
    return any(item.strip().replace(" ", "").lower() == "expandable_segments:true" for item in conf.split(","))


def empty_cache() -> str:
    """Release cached device memory; returns which call was made (for logs and tests).

    On NPU with expandable segments, `empty_virt_addr_cache` unmaps cached virtual ranges without
    handing physical memory back to the driver: the vendor measured ~4 s per full `empty_cache` and
    two per step, so the light call matters (vendor item C8).
    """
    kind = device_kind()
    if kind == "cpu":
        return "none"
    mod = accelerator_module()
    if kind == "npu" and expandable_segments_enabled() and hasattr(mod, "empty_virt_addr_cache"):
        mod.empty_virt_addr_cache()
        return "empty_virt_addr_cache"
    mod.empty_cache()
    return "empty_cache"


def synchronize() -> None:
    mod = accelerator_module()
    if mod is not None:
        mod.synchronize()


@dataclass(frozen=True)
class MemoryInfo:
    used_bytes: int
    free_bytes: int
    total_bytes: int

    def line(self, tag: str = "") -> str:
        gib = 1 << 30
        return (
            f"{tag + ': ' if tag else ''}used {self.used_bytes / gib:.2f} GiB, free {self.free_bytes / gib:.2f} GiB, "
            f"total {self.total_bytes / gib:.2f} GiB"
        )


def memory_info() -> MemoryInfo:
    """Device memory (host memory on the CPU, where the 'device' is the host)."""
    mod = accelerator_module()
    if mod is None:
        # lazy: only this path needs psutil; importing this module stays light
        import psutil

        vm = psutil.virtual_memory()
        return MemoryInfo(vm.total - vm.available, vm.available, vm.total)
    free, total = mod.mem_get_info()
    return MemoryInfo(total - free, free, total)


def profiler(output_dir: str, active_steps: int = 1, warmup_steps: int = 0, with_stack: bool = False) -> Any:
    """A started-when-entered profiler writing TensorBoard traces to output_dir: torch_npu's on NPU."""
    kind = device_kind()
    if kind == "npu":
        # deferred: torch_npu exists only on an NPU host
        import torch_npu

        prof = torch_npu.profiler
        activities = [prof.ProfilerActivity.CPU, prof.ProfilerActivity.NPU]
        extra = {
            "experimental_config": prof._ExperimentalConfig(
                profiler_level=prof.ProfilerLevel.Level2, aic_metrics=prof.AiCMetrics.ArithmeticUtilization
            )
        }
        handler = prof.tensorboard_trace_handler(output_dir)
    else:
        # lazy: the profiler loads only when a profile is taken
        import torch.profiler as prof

        activities = [prof.ProfilerActivity.CPU] + ([prof.ProfilerActivity.CUDA] if kind == "cuda" else [])
        extra = {}
        handler = prof.tensorboard_trace_handler(output_dir)
    return prof.profile(
        activities=activities,
        record_shapes=True,
        profile_memory=True,
        with_stack=with_stack,
        schedule=prof.schedule(wait=0, warmup=warmup_steps, active=active_steps, repeat=1),
        on_trace_ready=handler,
        **extra,
    )


@contextlib.contextmanager
def maybe_profile(enabled: bool, output_dir: str, **kwargs: Any):
    """Profile the block only when enabled (e.g. on chosen ranks); otherwise a no-op."""
    if not enabled:
        yield None
        return
    with profiler(output_dir, **kwargs) as prof:
        yield prof
