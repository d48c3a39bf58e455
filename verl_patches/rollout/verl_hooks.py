"""Wraps of verl's vLLMRollout (declared in patches/verl/workers/rollout/declarations.py).

- `__init__`: with VLLM_DP_SIZE > 1, every rank exports its VLLM_DP_* (F2; ports from the launch's
  VERL_PATCHES_VLLM_DP_BASE_PORT) before verl initialises vLLM's parallel state (vllm-ascend's ParallelConfig
  reads the DP size from the environment); the engine is built under the real torch.compile (F1).
- `generate_sequences`: runs under the real torch.compile (F1), whatever MindSpeed set for training.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base.env_flags import env_int, env_str
from verl_patches.compile_toggle import real_torch_compile
from verl_patches.rollout.dp_env import dp_base_port, init_vllm_dp_env


def _dp_env_from_config(config: Any) -> None:
    dp = env_int("VLLM_DP_SIZE", 1)
    if dp <= 1 or env_str("VLLM_DP_MASTER_PORT"):
        return

    tp = int(config.get("tensor_model_parallel_size", 1))
    init_vllm_dp_env(tp=tp, dp=dp, base_port=dp_base_port())


def wrap_rollout_init(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self: Any, model_path: str, config: Any, *args: Any, **kwargs: Any) -> None:
        _dp_env_from_config(config)
        with real_torch_compile():
            original(self, model_path, config, *args, **kwargs)

    return __init__


def wrap_generate_sequences(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def generate_sequences(self: Any, *args: Any, **kwargs: Any) -> Any:
        with real_torch_compile():
            return original(self, *args, **kwargs)

    return generate_sequences
