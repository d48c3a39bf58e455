"""The training ops MindSpeed calls through torch_npu: op (as the wheel registers it) -> plain-torch kernel.

`training_functions()` builds each as a Python function with the wheel's schema as its signature
(`wheel_contract.python_ops`), for the stand-in torch_npu to expose under the op's name. Only the overloads
MindSpeed calls are emulated: npu_apply_adam_w is its ``.out`` form (``out=(param, exp_avg, exp_avg_sq)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verl_patches.npu_emulation.ops import activation, attention, norm, optim, rotary, softmax
from verl_patches.npu_emulation.wheel_contract.python_ops import wheel_function

TRAINING_OPS: dict[str, Callable[..., Any]] = {
    "npu::npu_rms_norm": norm.npu_rms_norm,
    "npu::npu_swiglu": activation.npu_swiglu,
    "npu::npu_swiglu_backward": activation.npu_swiglu_backward,
    "npu::npu_rotary_mul": rotary.npu_rotary_mul,
    "npu::npu_fusion_attention": attention.npu_fusion_attention,
    "npu::npu_fusion_attention_grad": attention.npu_fusion_attention_grad,
    "npu::npu_scaled_masked_softmax": softmax.npu_scaled_masked_softmax,
    "npu::npu_apply_adam_w.out": optim.npu_apply_adam_w,
}


def training_functions() -> dict[str, Callable[..., Any]]:
    """torch_npu name -> the op as a Python function with the wheel's signature."""
    return {op.split("::", 1)[1].split(".", 1)[0]: wheel_function(op, kernel) for op, kernel in TRAINING_OPS.items()}
