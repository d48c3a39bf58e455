"""What torch_npu.contrib.transfer_to_npu does, with the NPU being the host CPU.

The real module remaps CUDA calls process-wide onto the NPU: `torch.cuda.*` becomes `torch.npu.*`,
"cuda" device arguments of tensor factories become "npu", `.cuda()` becomes `.npu()` and an "nccl"
process group becomes "hccl". Megatron and MindSpeed rely on that remapping on A3. On a CPU host
the same remapping ends on the CPU: device arguments naming cuda/npu (or a bare device index) become
"cpu", `.cuda()`/`.npu()` return the tensor on the CPU, and nccl/hccl process groups use gloo.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch

ACCELERATOR_TYPES = ("cuda", "npu")
# torch functions that take a `device` argument and are called with "cuda" by Megatron/MindSpeed.
FACTORY_FUNCTIONS = (
    "empty",
    "zeros",
    "ones",
    "full",
    "tensor",
    "as_tensor",
    "arange",
    "range",
    "linspace",
    "logspace",
    "rand",
    "randn",
    "randint",
    "randperm",
    "empty_like",
    "zeros_like",
    "ones_like",
    "full_like",
    "rand_like",
    "randn_like",
    "randint_like",
    "empty_strided",
    "eye",
    "tril_indices",
    "triu_indices",
    "normal",
    "scalar_tensor",
)
TENSOR_METHODS = ("new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "new_empty_strided")
_APPLIED = False
_native_depth = 0  # > 0 while code that runs on the emulated npu device runs (the rollout engine)


@contextlib.contextmanager
def native_devices() -> Iterator[None]:
    """Inside: no remapping, "npu" means the emulated npu device (verl_patches.npu_emulation.device).

    The remapping exists for Megatron and MindSpeed, whose CPU proof runs on CPU tensors. vllm-ascend's engine,
    colocated in the same worker process, runs on npu tensors: its model runner's `torch.zeros(...,
    device="npu:0")` must give an npu tensor beside the npu weights, not a CPU one. The rollout's entry points
    (engine build, generate, sleep/wake-up) run inside this scope. Re-entrant; a no-op where nothing was remapped
    (A3, where the real torch_npu maps cuda to npu).
    """
    global _native_depth
    _native_depth += 1
    try:
        yield
    finally:
        _native_depth -= 1


def host_device(device: Any) -> Any:
    """The CPU for any accelerator device (name, torch.device or bare index); anything else unchanged."""
    if isinstance(device, bool):
        return device
    if isinstance(device, int):
        return torch.device("cpu")
    if isinstance(device, str):
        kind = device.split(":", 1)[0]
        return "cpu" if kind in ACCELERATOR_TYPES else device
    if isinstance(device, torch.device) and device.type in ACCELERATOR_TYPES:
        return torch.device("cpu")
    return device


def _map_device_kwarg(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _native_depth:
            return fn(*args, **kwargs)
        if "device" in kwargs:
            kwargs["device"] = host_device(kwargs["device"])
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False  # pinned host memory serves device copies; the device is the host here
        return fn(*args, **kwargs)

    wrapper.__verl_patches_transfer__ = fn
    return wrapper


def _pinned_is_plain(self, *args, **kwargs):
    # torch: "copies the tensor to pinned memory, if it's not already pinned"; nothing is pinned here, so
    # always a copy in plain host memory. Returning `self` aliased the device buffer: verl's Megatron
    # offload keeps `param_data.cpu().pin_memory()` and then frees the device storage, which lost the weights.
    return self.clone()


def _is_device_like(a: Any) -> bool:
    return (
        isinstance(a, torch.device)
        or (isinstance(a, str) and a.split(":", 1)[0] in ACCELERATOR_TYPES + ("cpu",))
        or (isinstance(a, int) and not isinstance(a, bool))
    )


def _map_to(fn):
    """Tensor.to / Module.to: a positional device (first argument) or device= maps to the CPU."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        if _native_depth:
            return fn(self, *args, **kwargs)
        if args and _is_device_like(args[0]):
            args = (host_device(args[0]),) + args[1:]
        if "device" in kwargs:
            kwargs["device"] = host_device(kwargs["device"])
        return fn(self, *args, **kwargs)

    wrapper.__verl_patches_transfer__ = fn
    return wrapper


def _to_host(self, device=None, non_blocking: bool = False, **kwargs):
    if _native_depth:
        target = torch.device("npu", device) if isinstance(device, int) else (device or "npu")
        return self.to(target, non_blocking=non_blocking) if isinstance(self, torch.Tensor) else self.to(target)
    return self.to("cpu", non_blocking=non_blocking) if isinstance(self, torch.Tensor) else self.to("cpu")


def _device_type_name(fn):
    """Tensor.type() with no argument: transfer_to_npu reports device tensors as torch.cuda.*Tensor
    (Megatron's optimizers check those names); here every tensor lives on the emulated device."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        name = fn(self, *args, **kwargs)
        if (
            not _native_depth
            and not args
            and not kwargs
            and isinstance(name, str)
            and name.startswith("torch.")
            and not name.startswith("torch.cuda.")
        ):
            return "torch.cuda." + name[len("torch.") :]
        return name

    wrapper.__verl_patches_transfer__ = fn
    return wrapper


def _histc_any_dtype(fn):
    """torch.histc on integer tensors: the NPU kernel takes them (MindSpeed-LLM's router counts tokens per
    expert with it), the CPU kernel does not. Same bins, result in the input's dtype."""

    @functools.wraps(fn)
    def wrapper(input, *args, **kwargs):
        if isinstance(input, torch.Tensor) and not input.is_floating_point() and "out" not in kwargs:
            return fn(input.double(), *args, **kwargs).to(input.dtype)
        return fn(input, *args, **kwargs)

    wrapper.__verl_patches_transfer__ = fn
    return wrapper


def _init_process_group(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        backend = kwargs.get("backend", args[0] if args else None)
        if isinstance(backend, str) and backend.lower() in ("nccl", "hccl"):
            if args:
                args = ("gloo",) + args[1:]
            else:
                kwargs["backend"] = "gloo"
        if "device_id" in kwargs:
            kwargs["device_id"] = None
        return fn(*args, **kwargs)

    wrapper.__verl_patches_transfer__ = fn
    return wrapper


def _cuda_names_to_npu() -> None:
    import torch_npu  # noqa: F401  (the emulated one: registers torch.npu)

    npu = torch.npu
    for name in (
        "current_device",
        "device_count",
        "set_device",
        "synchronize",
        "is_initialized",
        "get_rng_state",
        "set_rng_state",
        "get_rng_state_all",
        "set_rng_state_all",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "initial_seed",
        "empty_cache",
        "memory_allocated",
        "max_memory_allocated",
        "memory_reserved",
        "max_memory_reserved",
        "memory_stats",
        "mem_get_info",
        "reset_max_memory_allocated",
        "reset_peak_memory_stats",
        "get_device_name",
        "get_device_capability",
        "get_device_properties",
        "Stream",
        "Event",
        "current_stream",
        "default_stream",
        "stream",
        "device",
        "_lazy_call",
        "_lazy_init",
        "default_generators",
        "set_per_process_memory_fraction",
    ):
        setattr(torch.cuda, name, getattr(npu, name))
    for name in (
        "FloatTensor",
        "HalfTensor",
        "BFloat16Tensor",
        "DoubleTensor",
        "IntTensor",
        "LongTensor",
        "ByteTensor",
        "BoolTensor",
    ):
        setattr(torch.cuda, name, getattr(torch, name))  # legacy typed constructors and isinstance checks


def apply() -> None:
    """Install the remapping once per process (importing torch_npu.contrib.transfer_to_npu calls it)."""
    global _APPLIED
    if _APPLIED:
        return
    # `with torch.device(...)` (vLLM builds its model inside one) gives factories called without a device that
    # device; torch recognises them from a set of its own functions computed once, on first use. Computed
    # after the wrappers below replace them, the set would hold the wrappers, and the originals they call
    # would get no device (a CPU tensor inside `with torch.device("npu:0")`): compute it now, from the originals.
    # lazy: torch's private module that keeps the set; only this call needs it
    from torch.utils import _device as device_mode

    device_mode._device_constructors()
    for name in FACTORY_FUNCTIONS:
        wrapper = _map_device_kwarg(getattr(torch, name))
        setattr(torch, name, wrapper)
        # TorchScript (which MindSpeed substitutes for torch.compile) must still see the aten op here.
        torch.jit._builtins._register_builtin(wrapper, f"aten::{name}")
    for name in TENSOR_METHODS:
        setattr(torch.Tensor, name, _map_device_kwarg(getattr(torch.Tensor, name)))
    torch.Tensor.to = _map_to(torch.Tensor.to)
    torch.nn.Module.to = _map_to(torch.nn.Module.to)
    torch.histc = _histc_any_dtype(torch.histc)
    torch.jit._builtins._register_builtin(torch.histc, "aten::histc")
    torch.Tensor.type = _device_type_name(torch.Tensor.type)
    torch.Tensor.pin_memory = _pinned_is_plain
    torch.Tensor.cuda = _to_host
    torch.Tensor.npu = _to_host
    torch.nn.Module.cuda = _to_host
    torch.nn.Module.npu = _to_host
    torch.distributed.init_process_group = _init_process_group(torch.distributed.init_process_group)
    _cuda_names_to_npu()
    _APPLIED = True
