"""The `LLM` verl's vLLMRollout builds, on A3: vLLM's LLM with our lifecycle instead of sleep mode.

`build_llm(**verl_kwargs)` replaces the name `LLM` inside verl's vllm_rollout_spmd (declared patch). It
  - adjusts the engine arguments (`rollout_llm_kwargs`, pure): no sleep mode (it needs camem and does not
    free memory on multi-node NPU), no prefix caching (the KV cache is freed between steps), expert
    parallelism on when VLLM_DP_SIZE > 1 (F2), vllm-ascend's additional_config for TorchAir graph mode
    from VLLM_ENABLE_GRAPH_MODE (graph batch size = max_num_seqs) and its scheduler;
  - builds the engine under the real torch.compile (F1: MindSpeed's jit.script must not reach it);
  - returns an `LLM` whose `sleep(level)` frees the KV cache and offloads the weights and whose
    `wake_up(tags)` onloads weights / re-creates the KV cache (lifecycle.py), so verl's own calls
    (`sleep(level=1)` after construction, the sharding manager's `wake_up`) never touch camem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any


def _flag(environ: Mapping[str, str], name: str) -> bool:
    return environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


def rollout_llm_kwargs(kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    out = dict(kwargs)
    out["enable_sleep_mode"] = False
    out["enable_prefix_caching"] = False
    dp = int(env.get("VLLM_DP_SIZE", "1") or 1)
    if dp > 1:
        out["enable_expert_parallel"] = True
    max_num_seqs = int(out.get("max_num_seqs") or 256)
    extra = dict(out.get("additional_config") or {})
    graph = _flag(env, "VLLM_ENABLE_GRAPH_MODE")
    extra.setdefault("torchair_graph_config", {"enabled": graph, "use_cached_graph": False,
                                               "graph_batch_sizes_init": False, "graph_batch_sizes": [max_num_seqs],
                                               "enable_multistream_moe": graph, "enable_multistream_mla": graph,
                                               "enable_view_optimize": False, "enable_kv_nz": False})
    extra.setdefault("ascend_scheduler_config", {"enabled": True, "enable_chunked_prefill": False})
    extra.setdefault("refresh", True)
    out["additional_config"] = extra
    return out


_OVERLAY_CLASS: type | None = None


def overlay_llm_class() -> type:
    """vllm.LLM with sleep/wake_up mapped to the lifecycle (created once, on first use)."""
    global _OVERLAY_CLASS
    if _OVERLAY_CLASS is None:
        from vllm import LLM

        from verl_patches.rollout.lifecycle import RolloutLifecycle

        class OverlayLLM(LLM):
            def sleep(self, level: int = 1) -> None:
                life = RolloutLifecycle(self)
                life.free_cache_engine()
                life.offload_model_weights()

            def wake_up(self, tags: list[str] | None = None) -> None:
                life = RolloutLifecycle(self, device=_device())
                if tags is None or "weights" in tags:
                    life.onload_model_weights()
                if tags is None or "kv_cache" in tags:
                    life.init_cache_engine()

        _OVERLAY_CLASS = OverlayLLM
    return _OVERLAY_CLASS


def _device() -> Any:
    from verl_patches.device import torch_device

    return torch_device()


def build_llm(*args: Any, **kwargs: Any) -> Any:
    from verl_patches.patches.mindspeed.compile_toggle import real_torch_compile

    with real_torch_compile():
        return overlay_llm_class()(*args, **rollout_llm_kwargs(kwargs))
