"""The Megatron → rollout sharding manager (vendor item E1), replacing verl's ``MegatronVLLMShardingManager``.

``__enter__`` (train → rollout):
  1. build the streamed weight generator (`verl_patches.sync.generator` through the patched
     ``per_tensor_generator``: lockstep PP exchange, expert all-to-all-v, or the all-gather path);
  2. bring the rollout's weights back onto the device (``rollout.onload_model_weights()``; without a rollout
     object, vLLM's ``wake_up(tags=["weights"])`` as upstream);
  3. re-attach vLLM's MoE weight loaders (verl's ``patch_vllm_moe_model_weight_loader``);
  4. stream the generator into the rollout: ``rollout.load_weights`` when the rollout object has it (the
     rollout engine's lifecycle, `verl_patches.rollout.lifecycle.RolloutLifecycle`, which loads and
     rebuilds MLA), else the model runner's ``model.load_weights``;
  5. in the second case rebuild the MLA absorbed matrices from the new ``kv_b_proj`` (the rollout's
     ``rebuild_mla_absorbed()`` hook, else `verl_patches.rollout.lifecycle.rebuild_mla`), after *every*
     load, so the rollout never decodes with the previous step's attention weights.
``__exit__`` (rollout → train): ``rollout.free_cache_engine()``, ``rollout.offload_model_weights()`` (or vLLM's
``sleep(level=1)``), every actor chunk ``.train()``, then the device's ``empty_cache``.

Data pre/post-processing is upstream's: all-gather the batch over the rollout TP group, keep this TP rank's
chunk afterwards. The constructor accepts upstream's keyword arguments plus ``rollout`` (the rollout
object, whose lifecycle methods come from the rollout engine); the collaborators that need vLLM or Megatron
are resolved lazily, and can be injected (tests).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

from verl_patches.device import empty_cache
from verl_patches.resilience import progress
from verl_patches.rollout.lifecycle import rebuild_mla

logger = logging.getLogger(__name__)
SWITCH_TIME_ATTR = "_verl_patches_enter_s"  # read by verl_patches.patches.verl.workers.step_timing

Weights = Iterable[tuple[str, torch.Tensor]]


def _engine_model(inference_engine: Any) -> Any:
    return inference_engine.llm_engine.model_executor.driver_worker.worker.model_runner.model


def _default_weights(manager: MegatronRolloutShardingManager) -> Weights:
    from verl.utils.megatron_utils import per_tensor_generator  # our patched generator once patches apply

    weights: Weights = per_tensor_generator(
        manager.actor_module,
        manager.model_config,
        manager.weight_converter,
        manager.transformer_config,
        manager.layer_name_mapping,
    )
    return weights


def _default_prepare(model: Any) -> None:
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.utils.vllm_utils import patch_vllm_moe_model_weight_loader

    patch_vllm_moe_model_weight_loader(model)


def _default_empty_cache() -> None:
    empty_cache()


class MegatronRolloutShardingManager:
    def __init__(
        self,
        actor_module: Any,
        inference_engine: Any = None,
        model_config: Any = None,
        transformer_config: Any = None,
        layer_name_mapping: Any = None,
        weight_converter: Any = None,
        module: Any = None,
        *,
        rollout: Any = None,
        weights_fn: Callable[[MegatronRolloutShardingManager], Weights] = _default_weights,
        prepare_model: Callable[[Any], None] = _default_prepare,
        empty_cache: Callable[[], None] = _default_empty_cache,
        infer_tp: tuple[int, int, Any] | None = None,
    ) -> None:
        self.actor_module = actor_module
        self.rollout = rollout
        self.inference_engine: Any = (
            inference_engine if inference_engine is not None else getattr(rollout, "inference_engine", None)
        )
        self.model_config = model_config
        self.transformer_config = transformer_config
        self.layer_name_mapping = layer_name_mapping
        self.weight_converter = weight_converter
        self.module = module
        self._weights_fn, self._prepare, self._empty_cache = weights_fn, prepare_model, empty_cache
        self._infer_tp = infer_tp
        self.loaded_params = 0
        self.mla_layers_rebuilt: int | None = 0

    # ------------------------------------------------------------------------------ rollout access

    @property
    def rollout_model(self) -> Any:
        model = getattr(self.rollout, "model", None) if self.rollout is not None else None
        return model if model is not None else _engine_model(self.inference_engine)

    def _lifecycle(self, name: str) -> Callable[..., Any] | None:
        return getattr(self.rollout, name, None) if self.rollout is not None else None

    def _onload(self) -> None:
        onload = self._lifecycle("onload_model_weights")
        if onload is not None:
            onload()
        else:
            self.inference_engine.wake_up(tags=["weights"])

    def _offload(self) -> None:
        free = self._lifecycle("free_cache_engine")
        offload = self._lifecycle("offload_model_weights")
        if free is not None or offload is not None:
            if free is not None:
                free()
            if offload is not None:
                offload()
        else:
            self.inference_engine.sleep(level=1)

    def _load(self, model: Any, weights: Weights) -> tuple[Any, int | None]:
        """Load, then rebuild MLA; returns (loaded names, layers rebuilt or None when the rollout did it)."""
        load = self._lifecycle("load_weights")
        if load is not None:
            return load(weights), None
        loaded = model.load_weights(weights)
        hook = self._lifecycle("rebuild_mla_absorbed")
        if hook is not None:
            return loaded, int(hook() or 0)

        return loaded, rebuild_mla(model)

    # ------------------------------------------------------------------------------ lifecycle

    def __enter__(self) -> MegatronRolloutShardingManager:
        start = time.perf_counter()
        progress.phase("weight_sync")  # hang diagnosis; the generator marks each bucket
        try:
            weights = self._weights_fn(self)
            self._onload()
            model = self.rollout_model
            self._prepare(model)
            loaded, rebuilt = self._load(model, weights)
            self.loaded_params = len(loaded) if loaded is not None else 0
            self.mla_layers_rebuilt = rebuilt
            logger.info(
                "weight sync: %d parameters loaded, MLA rebuilt (%s layers)",
                self.loaded_params,
                "by the rollout" if rebuilt is None else rebuilt,
            )
        finally:
            setattr(self, SWITCH_TIME_ATTR, time.perf_counter() - start)
        progress.phase("generate")
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        progress.phase("rollout_offload")
        self._offload()
        for chunk in self.actor_module:
            chunk.train()
        self._empty_cache()

    # ------------------------------------------------------------------------------ data (as upstream)

    def _tp(self) -> tuple[int, int, Any]:
        if self._infer_tp is None:
            # deferred: importing this module must not load vLLM; it loads once the prelude patched it
            from vllm.distributed import parallel_state as vllm_ps

            group = vllm_ps.get_tensor_model_parallel_group()
            self._infer_tp = (
                vllm_ps.get_tensor_model_parallel_world_size(),
                vllm_ps.get_tensor_model_parallel_rank(),
                getattr(group, "device_group", group),
            )
        return self._infer_tp

    def preprocess_data(self, data: Any) -> Any:
        size, _, group = self._tp()
        if size == 1:
            return data
        # deferred: importing this module must not load verl; it loads once the prelude patched it
        from verl.protocol import all_gather_data_proto

        all_gather_data_proto(data, group)
        return data

    def postprocess_data(self, data: Any) -> Any:
        size, rank, _ = self._tp()
        if size == 1:
            return data
        return data.chunk(chunks=size)[rank]
