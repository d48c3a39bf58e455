"""vLLM 0.9.1's V1 engine, asked for float32 on a CPU host, decides V1 support as it would for bf16.

`EngineArgs._is_v1_supported_oracle` refuses every dtype but fp16/bf16 ("only FA"): with VLLM_USE_V1=1 that
is `NotImplementedError: VLLM_USE_V1=1 is not supported with --dtype torch.float32`. The reason is a GPU
kernel limit; on a CPU host the attention and MoE kernels are our plain-torch emulation, which computes in
any dtype. The tiny run keeps float32 so the rollout's log-probs agree with the training engine's to < 1e-3
(the rollout_mismatch metrics), as the A3 run's bf16 engines cannot. Every other V1 rule is decided by the
original: the dtype is shown to it as bf16 for the duration of the call and restored after. Never on A3.
Letting float32 through declares the CPU proof's exceptions to the emulated kernels' documented limits (float32
where they list bf16/fp16; the scaled-down model's sizes): verl_patches/npu_emulation/wheel_contract/cpu_proof.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from verl_patches.npu_emulation.wheel_contract.cpu_proof import FP32_RUN, SCALED_MODEL, declare


def wrap_v1_oracle(original: Callable[..., Any]) -> Callable[..., Any]:
    """`_is_v1_supported_oracle` that treats float32 like bfloat16 (every other rule unchanged)."""

    @functools.wraps(original)
    def oracle(self: Any, model_config: Any) -> Any:
        if getattr(model_config, "dtype", None) != torch.float32:
            return original(self, model_config)
        declare(FP32_RUN)
        declare(SCALED_MODEL)
        model_config.dtype = torch.bfloat16
        try:
            return original(self, model_config)
        finally:
            model_config.dtype = torch.float32

    return oracle
