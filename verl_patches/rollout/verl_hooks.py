"""Wraps of verl's vLLMRollout (declared in patches/verl/workers/rollout/declarations.py).

- `__init__`: with VLLM_DP_SIZE > 1, every rank exports its VLLM_DP_* (F2; ports from the launch's
  VERL_PATCHES_VLLM_DP_BASE_PORT) before verl initialises vLLM's parallel state (vllm-ascend's ParallelConfig
  reads the DP size from the environment); the engine is built under the real torch.compile (F1).
- `generate_sequences`: runs under the real torch.compile (F1), whatever MindSpeed set for training, and returns
  with each response's count of tokens sampled in TorchAir graph decode steps (`decode_share`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base import env_registry
from verl_patches.compile_toggle import real_torch_compile
from verl_patches.rollout import decode_share
from verl_patches.rollout.dp_env import dp_base_port, init_vllm_dp_env


def _dp_env_from_config(config: Any) -> None:
    dp = env_registry.integer("VLLM_DP_SIZE")
    if dp <= 1 or env_registry.is_set("VLLM_DP_MASTER_PORT"):  # set by hand: the dry run names what it turns off
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


def _model_runner(llm: Any) -> Any:
    """The engine's model runner, None for an engine without one (the rollout stand-in)."""
    # lazy: that module loads torch; importing this one must not
    from verl_patches.rollout.lifecycle import model_runner_of

    try:
        return model_runner_of(llm)
    except AttributeError:
        return None


def wrap_generate_sequences(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def generate_sequences(self: Any, *args: Any, **kwargs: Any) -> Any:
        llm = self.inference_engine
        with real_torch_compile(), decode_share.captured_generate(llm) as calls:
            output = original(self, *args, **kwargs)
        decode_share.attach_counts(output, _model_runner(llm), calls)
        return output

    return generate_sequences
