"""torch.npu on a CPU host: logical devices whose memory is host memory and whose RNG is the CPU's.

As many devices as ASCEND_RT_VISIBLE_DEVICES lists (one when unset), as torch_npu counts them; set_device
refuses an index outside them and is remembered (current_device), so a process that sees several devices
and never chose one is visible to the emulated HCCL backend, which refuses it as the real one would put
every rank of a node on device 0.

is_available() is False, so device probes (verl, accelerate, Megatron) keep choosing the CPU; code that
calls the npu API directly (MindSpeed, vllm-ascend) gets CPU-backed answers.
"""

import contextlib
import os

import torch

# the device extension first, then the submodules in the order the package's start-up expects
# isort: off
from verl_patches.npu_emulation.device.build import loaded_extension
from torch_npu.npu import memory, streams, utils  # noqa: F401
from torch_npu.npu.memory import (  # noqa: F401
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from torch_npu.npu.streams import Event, Stream, current_stream, default_stream, stream  # noqa: F401
from torch_npu.npu.graphs import ExternalEvent, NPUGraph, graph  # noqa: F401  (vllm-ascend)
from torch_npu.npu import config  # noqa: F401  (vllm-ascend sets config.allow_internal_format)
from torch_npu.npu.utils import get_soc_version  # noqa: F401

# isort: on

_initialized = True
default_generators = (torch.default_generator,)

BFloat16Tensor = torch.BFloat16Tensor if hasattr(torch, "BFloat16Tensor") else None
FloatTensor = torch.FloatTensor
HalfTensor = torch.HalfTensor
DoubleTensor = torch.DoubleTensor
IntTensor = torch.IntTensor
LongTensor = torch.LongTensor
ByteTensor = torch.ByteTensor
BoolTensor = torch.BoolTensor


def is_available() -> bool:
    return False


def is_initialized() -> bool:
    return True


def init() -> None:
    return None


def _lazy_init() -> None:
    return None


def _lazy_call(callable_, **kwargs) -> None:
    callable_()


_current: int | None = None  # set_device's index; None until a process chooses


def device_count() -> int:
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "").strip()
    return len([d for d in visible.split(",") if d.strip()]) if visible else 1


def current_device() -> int:
    ext = loaded_extension()  # the npu device's own record (per thread, as on the device)
    if ext is not None:
        return ext.current_device()
    return 0 if _current is None else _current


def device_was_set() -> bool:
    return _current is not None


def set_device(device) -> None:
    global _current
    if isinstance(device, torch.device):
        index = 0 if device.index is None else device.index
    elif isinstance(device, str):
        index = int(device.split(":", 1)[1]) if ":" in device else 0
    else:
        index = int(device)
    if not 0 <= index < device_count():
        raise RuntimeError(
            f"Invalid device ID {index}: this process sees {device_count()} NPU(s) "
            f"(ASCEND_RT_VISIBLE_DEVICES={os.environ.get('ASCEND_RT_VISIBLE_DEVICES', '')!r})"
        )
    _current = index
    ext = loaded_extension()
    if ext is not None:
        ext.set_device(index)  # where npu tensors without an index are allocated


def synchronize(device=None) -> None:
    return None


@contextlib.contextmanager
def device(device=None):
    yield


def get_device_name(device=None) -> str:
    return "cpu (torch_npu emulation)"


def get_device_capability(device=None) -> tuple[int, int]:
    return (0, 0)


class _Properties:
    name = "cpu (torch_npu emulation)"
    major, minor = 0, 0

    @property
    def total_memory(self) -> int:
        return memory.mem_get_info()[1]


def get_device_properties(device=None) -> _Properties:
    return _Properties()


# The generator itself, never torch.manual_seed & co: those call torch.cuda.*, which transfer_to_npu
# points here.
def get_rng_state(device="npu") -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device="npu") -> None:
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list:
    return [get_rng_state()]


def set_rng_state_all(states) -> None:
    set_rng_state(states[0])


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    manual_seed(seed)


def _is_in_bad_fork() -> bool:
    return False  # torch.manual_seed seeds a device module only when it has this (and manual_seed_all)


def seed() -> None:
    torch.default_generator.seed()


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def set_compile_mode(jit_compile: bool = False) -> None:
    return None


def set_option(option: dict) -> None:
    return None


def is_bf16_supported() -> bool:
    return True


def is_current_stream_capturing() -> bool:
    return False
