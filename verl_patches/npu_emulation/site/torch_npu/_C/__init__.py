"""The compiled-extension names that Python code reaches for, on the CPU."""

from torch_npu._C import _distributed_c10d  # noqa: F401
from torch_npu._C._graph_task import _NPUTaskGroupHandle  # noqa: F401  (vllm-ascend)


def _npu_get_soc_version() -> int:
    # deferred: torch_npu imports this module; resolved at call time
    from torch_npu.npu.utils import get_soc_version

    return get_soc_version()
