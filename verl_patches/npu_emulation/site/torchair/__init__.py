"""CPU stand-in for torchair (Ascend graph mode). Graph mode never runs on a CPU host: converters are
registered and never called; ops that only exist in graph mode raise when used."""

from torchair import ge  # noqa: F401
from torchair._graph_mode import CompilerConfig, get_npu_backend, patch_for_hcom  # noqa: F401  (vllm-ascend)


def register_fx_node_ge_converter(target):
    def decorator(fn):
        return fn

    return decorator
