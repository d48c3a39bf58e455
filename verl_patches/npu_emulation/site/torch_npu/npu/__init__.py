"""torch.npu on a CPU host: one logical device whose memory is host memory and whose RNG is the CPU's.

is_available() is False, so device probes (verl, accelerate, Megatron) keep choosing the CPU; code that
calls the npu API directly (MindSpeed, vllm-ascend) gets CPU-backed answers.
"""

import contextlib

import torch

from torch_npu.npu import memory, streams, utils  # noqa: F401
from torch_npu.npu.memory import (  # noqa: F401
    empty_cache, max_memory_allocated, max_memory_reserved, mem_get_info, memory_allocated, memory_reserved,
    memory_stats, reset_max_memory_allocated, reset_peak_memory_stats, set_per_process_memory_fraction,
)
from torch_npu.npu.streams import Event, Stream, current_stream, default_stream, stream  # noqa: F401
from torch_npu.npu.graphs import ExternalEvent, NPUGraph, graph  # noqa: F401  (vllm-ascend)
from torch_npu.npu import config  # noqa: F401  (vllm-ascend sets config.allow_internal_format)
from torch_npu.npu.utils import get_soc_version  # noqa: F401

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


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def set_device(device) -> None:
    return None


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
