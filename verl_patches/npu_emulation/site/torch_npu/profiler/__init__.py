"""torch_npu.profiler on the CPU: torch.profiler, with the NPU-only knobs accepted and ignored."""

import enum

from torch.profiler import ProfilerActivity as _TorchActivity
from torch.profiler import profile, schedule, tensorboard_trace_handler  # noqa: F401


class ProfilerActivity:
    CPU = _TorchActivity.CPU
    NPU = _TorchActivity.CPU  # the "device" is the host


class ProfilerLevel(enum.Enum):
    Level_none = 0
    Level0 = 1
    Level1 = 2
    Level2 = 3


class AiCMetrics(enum.Enum):
    PipeUtilization = 0
    ArithmeticUtilization = 1


class ExportType(enum.Enum):
    Text = 0
    Db = 1


class _ExperimentalConfig:
    def __init__(self, **kwargs) -> None:
        self.options = kwargs
