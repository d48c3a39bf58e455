"""Graph-capture names vllm-ascend imports (ACL graph mode): present so its modules import on a CPU host;
capture itself needs an NPU."""

from torch_npu.npu.streams import Event


class ExternalEvent(Event):
    """An event that can be recorded inside a captured graph; on the CPU, a plain event."""

    def reset(self, stream=None) -> None:
        return None


class NPUGraph:
    def __init__(self, *args, **kwargs) -> None:
        raise RuntimeError("torch.npu.NPUGraph: graph capture needs an Ascend NPU (CPU host)")


def graph(*args, **kwargs):
    raise RuntimeError("torch.npu.graph: graph capture needs an Ascend NPU (CPU host)")
