"""torch_npu.op_plugin.atb._atb_ops on a CPU host: the `torch_npu.atb` namespace vllm-ascend calls
(torch_npu.atb.npu_ring_mla, ...) and the registration hook its NPUWorker calls at start-up.

As in torch_npu, `torch_npu.atb` is a module object (also in sys.modules) whose attributes are the ops
`torch.ops.atb.<name>`; the stand-in torch_npu package fills it when it is imported (`add_atb_module`), with
the ops verl_patches.npu_emulation.ops.inference_registry registers.
"""

import sys
import types

ATB_MODULE_NAME = "torch_npu.atb"


def add_atb_module(ops: dict) -> types.ModuleType:
    """The torch_npu.atb module holding `ops` (name -> op), created once and kept in sys.modules."""
    module = sys.modules.get(ATB_MODULE_NAME)
    if module is None:
        module = sys.modules[ATB_MODULE_NAME] = types.ModuleType(ATB_MODULE_NAME)
    for name, op in ops.items():
        setattr(module, name, op)
    return module


def _register_atb_extensions() -> None:
    """vllm-ascend's NPUWorker calls this once; the emulated ATB ops are registered when torch_npu is imported."""
    return None
