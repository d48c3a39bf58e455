"""The `LLM` verl's vLLMRollout builds, on A3: vLLM's LLM with our lifecycle instead of sleep mode.

`build_llm(**verl_kwargs)` replaces the name `LLM` inside verl's vllm_rollout_spmd (declared patch). It
  - adjusts the engine arguments (`rollout_llm_kwargs`, pure): no sleep mode (it needs camem and does not
    free memory on multi-node NPU), no prefix caching (the KV cache is freed between steps), expert
    parallelism on when VLLM_DP_SIZE > 1 (F2). Everything else comes from the trainer config: verl passes
    ``actor_rollout_ref.rollout.engine_kwargs.vllm`` through, where the A3 profiles set ``max_num_seqs`` and
    vllm-ascend's ``additional_config`` (TorchAir graph mode with graph batch size = max_num_seqs,
    multistream MLA/MoE, the Ascend scheduler with the profile's chunked prefill); this module only checks
    that the graph batch size and the scheduler agree with the engine's own arguments and asks vllm-ascend
    to re-read its config (``refresh``);
  - builds the engine under the real torch.compile (F1: MindSpeed's jit.script must not reach it);
  - returns an `LLM` whose `sleep(level)` frees the KV cache and offloads the weights and whose
    `wake_up(tags)` onloads weights / re-creates the KV cache (lifecycle.py), so verl's own calls
    (`sleep(level=1)` after construction, the sharding manager's `wake_up`) never touch camem.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_patches.base import env_registry
from verl_patches.compile_toggle import real_torch_compile
from verl_patches.rollout.kv_nz_switch import kv_nz_wanted
from verl_patches.worker_calls.env_names import KV_NZ_FLAG


class EngineArgumentError(ValueError):
    """Engine arguments that contradict each other; the message names the config key to change."""


_ENGINE_KEYS = "actor_rollout_ref.rollout.engine_kwargs.vllm"


def rollout_llm_kwargs(kwargs: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    out = dict(kwargs)
    # verl v0.4.0 passes limit_mm_per_prompt=None for text-only data; vLLM 0.9.1's ModelConfig (a pydantic
    # dataclass) refuses None where it wants a dict: leave vLLM's default ({}) instead, as verl means
    if out.get("limit_mm_per_prompt", {}) is None:
        del out["limit_mm_per_prompt"]
    # verl passes True; vLLM 0.9.1 refuses it for a text-only model such as DeepSeek-V3 (the vendor passes False)
    out["disable_mm_preprocessor_cache"] = False
    out["enable_sleep_mode"] = False
    out["enable_prefix_caching"] = False
    dp = env_registry.integer("VLLM_DP_SIZE", env)
    if dp > 1:
        out["enable_expert_parallel"] = True
    extra = dict(out.get("additional_config") or {})
    graph = dict(extra.get("torchair_graph_config") or {})
    if graph.get("enabled"):
        seqs = out.get("max_num_seqs")
        if seqs is None or list(graph.get("graph_batch_sizes") or []) != [int(seqs)]:
            raise EngineArgumentError(
                f"{_ENGINE_KEYS}.additional_config.torchair_graph_config.graph_batch_sizes="
                f"{graph.get('graph_batch_sizes')} must be [{_ENGINE_KEYS}.max_num_seqs] = [{seqs}]"
            )
    scheduler = dict(extra.get("ascend_scheduler_config") or {})
    chunked = out.get("enable_chunked_prefill")
    if (
        scheduler.get("enabled")
        and chunked is not None
        and bool(scheduler.get("enable_chunked_prefill")) != bool(chunked)
    ):
        raise EngineArgumentError(
            f"{_ENGINE_KEYS}.additional_config.ascend_scheduler_config.enable_chunked_prefill="
            f"{scheduler.get('enable_chunked_prefill')} contradicts actor_rollout_ref.rollout.enable_chunked_prefill="
            f"{chunked}: vllm-ascend's scheduler would use its own value"
        )
    check_kv_nz_patch(graph, env)
    extra.setdefault("refresh", True)  # vllm-ascend keeps its first parsed config process-wide otherwise
    out["additional_config"] = extra
    out["seed"] = engine_seed(out.get("seed"), int(out.get("tensor_parallel_size") or 1), env)
    return out


def engine_seed(base: Any, tp: int, environ: Mapping[str, str]) -> int:
    """The seed of this rank's engine: `base` + the engine's index (global rank // TP). vLLM seeds its
    sampling stream (the device's default generator on A3) from it once, at engine start; every rank of
    one engine (its TP group: consecutive ranks in verl's layout) must draw the same noise to agree on the
    tokens, and every engine, across DP ranks and vLLM instances, draws its own."""
    rank = env_registry.integer("RANK", environ, default=0)
    return int(base or 0) + rank // max(1, tp)


def check_kv_nz_patch(graph: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """F4 is installed by a patch flag the launcher derives from this config; an engine whose config and
    flag disagree would either write an NZ cache without the fix or skip the ND cache writes it needs."""
    want = kv_nz_wanted(graph)
    flag = env_registry.flag(KV_NZ_FLAG, environ)
    if want != flag:
        raise EngineArgumentError(
            f"{_ENGINE_KEYS}.additional_config.torchair_graph_config: enabled={graph.get('enabled')}, "
            f"enable_kv_nz={graph.get('enable_kv_nz')} {'needs' if want else 'contradicts'} the F4 patch, "
            f"but {KV_NZ_FLAG}={environ.get(KV_NZ_FLAG, '(unset)')}: start the job with the launcher "
            f"(it sets {KV_NZ_FLAG} from this config) or set {KV_NZ_FLAG}={int(want)} in every process"
        )


_OVERLAY_CLASS: type | None = None


def overlay_llm_class() -> type:
    """vllm.LLM with sleep/wake_up mapped to the lifecycle (created once, on first use)."""
    global _OVERLAY_CLASS
    if _OVERLAY_CLASS is None:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm import LLM

        # lazy: that module loads torch; importing this one must not
        from verl_patches.rollout.lifecycle import RolloutLifecycle, model_runner_of

        class OverlayLLM(LLM):
            def sleep(self, level: int = 1) -> None:
                life = RolloutLifecycle(self)
                life.free_cache_engine()
                life.offload_model_weights()

            def wake_up(self, tags: list[str] | None = None) -> None:
                # the model runner's own device (npu:LOCAL_RANK): where its graphs and KV cache are
                life = RolloutLifecycle(self, device=model_runner_of(self).device)
                if tags is None or "weights" in tags:
                    life.onload_model_weights()
                if tags is None or "kv_cache" in tags:
                    life.init_cache_engine()

        _OVERLAY_CLASS = OverlayLLM
    return _OVERLAY_CLASS


def build_llm(*args: Any, **kwargs: Any) -> Any:
    """verl's `LLM(...)` on A3: our `OverlayLLM` with the engine arguments adjusted."""
    return build_engine(overlay_llm_class(), *args, **kwargs)


def build_engine(llm_class: type, *args: Any, **kwargs: Any) -> Any:
    """`llm_class` (`OverlayLLM` or a subclass of it) built with the engine arguments adjusted
    (`rollout_llm_kwargs`) under the real torch.compile; the first rank of each instance names the engine."""
    engine_kwargs = rollout_llm_kwargs(kwargs)
    with real_torch_compile():
        llm = llm_class(*args, **engine_kwargs)
    if first_rank_of_instance(int(engine_kwargs.get("tensor_parallel_size") or 1), os.environ):
        # lazy: that module loads torch; importing this one must not
        from verl_patches.rollout.engine_report import describe, report_line

        print(report_line(describe(llm)), flush=True)  # the job log names the engine that generates
    return llm


def first_rank_of_instance(tp: int, environ: Mapping[str, str]) -> bool:
    """Rank 0 of one vLLM instance (DP rank 0, TP rank 0 in verl's layout): one report line per instance."""
    dp_rank = env_registry.integer("VLLM_DP_RANK", environ)
    return dp_rank == 0 and env_registry.integer("RANK", environ, default=0) % max(1, tp) == 0


def build_standin_llm(*args: Any, **kwargs: Any) -> Any:
    """On a CPU host: the same engine arguments, given to the CPU stand-in instead of vLLM's engine."""
    # lazy: that module loads numpy, torch, transformers; importing this one must not
    from verl_patches.rollout.standin.engine import StandinLLM

    return StandinLLM(*args, **rollout_llm_kwargs(kwargs))
