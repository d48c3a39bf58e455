"""torchair.scope on a CPU host (vllm-ascend imports it): graph-mode scopes are no-ops on one CPU "stream".

They are plain classes with __enter__/__exit__, not `contextlib.contextmanager` generators: vllm-ascend enters
them inside the decode forward that TorchAir compiles with fullgraph=True, and dynamo (torch 2.5.1) traces a
class context manager but refuses a generator one ('skip function npu_stream_switch'), where the real
TorchAir scopes are captured into the graph.
"""

from __future__ import annotations

from typing import Any


class _Scope:
    """A scope that marks graph regions for the Ascend graph engine; nothing to mark on a CPU host."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


class super_kernel(_Scope):  # noqa: N801  (torchair's name)
    pass


class npu_stream_switch(_Scope):  # noqa: N801  (torchair's name)
    pass


def npu_wait_tensor(tensor: Any, dependency: Any = None, *args: Any, **kwargs: Any) -> Any:
    return tensor
