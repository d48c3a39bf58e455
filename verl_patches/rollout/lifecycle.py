"""E1/F1 rollout lifecycle: weight offload/onload and KV cache init/free, instead of vLLM's sleep/wake.

vLLM's sleep mode needs vllm-ascend's camem allocator (compiled `vllm_ascend_C`), does not release
memory on multi-node NPU, and keeps weights and KV cache in a pool torch_npu cannot free. Here the
rollout's memory is managed directly:

  offload_model_weights()  every parameter's `.data` becomes a host placeholder of the same shape/dtype
                           over one shared element: the device storage is released and no host copy is
                           made (the vendor kept a full-size host buffer per parameter; the next weight
                           sync overwrites everything anyway); MLA absorbed matrices are dropped
  onload_model_weights()   every parameter gets fresh, uninitialised device storage (filled by the sync)
  free_cache_engine()      the model runner's `kv_caches` and every attention layer's `kv_cache` in the
                           forward context are emptied
  init_cache_engine()      graphs that froze other weight addresses are dropped and compiled again
                           (graph_binding.py; with our unfrozen-parameters patch the weights are graph
                           inputs and nothing is dropped); when
                           `kv_caches` is empty, the engine core re-creates the cache from the KV cache
                           configs saved at first init (F3: same block count as the scheduler), keeping
                           the sampling stream (kv_cache_config.reinitialize_kv_caches)

The weight-sync sharding manager (issue #14) drives one GRPO step as
  onload_model_weights() -> model.load_weights(iter) -> rebuild_mla(model) -> init_cache_engine()
  -> generate -> free_cache_engine() -> offload_model_weights() -> train.
`device_bytes()` accounts the bytes the rollout's weights and KV cache hold on the device by walking
their storages (parameters, buffers, KV tensors; each storage counted once): this is what the
lifecycle test compares with the pre-generation baseline.

Works on a real vLLM `LLM` (V1 engine, in-process engine core with `external_launcher`) and on the
CPU stand-in, which offers the same attribute paths.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from verl_patches.device import empty_cache
from verl_patches.rollout.graph_binding import forget_graphs_if_moved
from verl_patches.rollout.kv_cache_config import reinitialize_kv_caches


def model_runner_of(llm: Any) -> Any:
    return llm.llm_engine.model_executor.driver_worker.worker.model_runner


def model_of(llm: Any) -> torch.nn.Module:
    return model_runner_of(llm).model


def engine_core_of(llm: Any) -> Any:
    """vLLM V1's in-process EngineCore (LLMEngine.engine_core is an InprocClient with `.engine_core`)."""
    client = llm.llm_engine.engine_core
    return getattr(client, "engine_core", client)


def _forward_context_layers(llm: Any) -> Iterable[Any]:
    config = getattr(llm.llm_engine, "vllm_config", None)
    ctx = getattr(getattr(config, "compilation_config", None), "static_forward_context", None) or {}
    return ctx.values()


def _is_decoder_attention(layer: Any) -> bool:
    try:
        # deferred: importing this module must not load vLLM; it loads once the prelude patched it
        from vllm.attention import AttentionType
    except ImportError:  # stand-in without vLLM attention types: every layer with a kv_cache counts
        return hasattr(layer, "kv_cache")
    return getattr(layer, "attn_type", AttentionType.DECODER) in (AttentionType.DECODER, AttentionType.ENCODER_DECODER)


def _empty_cache() -> None:
    gc.collect()

    empty_cache()


class RolloutLifecycle:
    """Lifecycle of one rollout engine (`LLM`) on one rank."""

    def __init__(self, llm: Any, device: torch.device | str | None = None) -> None:
        self.llm = llm
        self.model = model_of(llm)
        first = next(self.model.parameters())
        self.device = torch.device(device) if device is not None else first.device

    @property
    def weights_on_device(self) -> bool:
        """Read from the parameters, so several lifecycle objects over one engine always agree."""
        return not any(is_placeholder(p.data) for p in self.model.parameters())

    # ---- weights ------------------------------------------------------------------------------
    def offload_model_weights(self) -> None:
        for p in self.model.parameters():
            p.data = host_placeholder(p.data)  # shape/dtype kept, device storage released, nothing copied
        clear_mla(self.model)
        _empty_cache()

    def onload_model_weights(self) -> None:
        for p in self.model.parameters():
            if is_placeholder(p.data) or p.data.device != self.device:
                p.data = torch.empty(p.shape, dtype=p.dtype, device=self.device)  # no copy: the sync fills it

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The model runner's own loader, then the MLA rebuild (what the sharding manager calls)."""
        if not self.weights_on_device:
            raise RuntimeError("load_weights before onload_model_weights: the parameters have no device storage")
        loaded = self.model.load_weights(weights)
        rebuild_mla(self.model)
        return loaded

    # ---- KV cache -----------------------------------------------------------------------------
    def free_cache_engine(self) -> None:
        runner = model_runner_of(self.llm)
        for layer in _forward_context_layers(self.llm):
            if _is_decoder_attention(layer):
                layer.kv_cache = [torch.tensor([]) for _ in getattr(layer, "kv_cache", [None])]
            impl = getattr(layer, "impl", None)
            for name in ("key_cache", "value_cache"):  # non-MLA implementations keep their own references
                if impl is not None and getattr(impl, name, None) is not None:
                    setattr(impl, name, None)
        runner.kv_caches = []
        _empty_cache()

    def init_cache_engine(self) -> None:
        """Before the rollout generates again: TorchAir graphs that froze other weight addresses are dropped
        (graph_binding.py; the KV re-init's warm-up compiles them again), then the KV cache is re-created."""
        runner = model_runner_of(self.llm)
        forget_graphs_if_moved(runner)
        if not runner.kv_caches:
            reinitialize_kv_caches(engine_core_of(self.llm))

    # ---- accounting ---------------------------------------------------------------------------
    def device_bytes(self) -> int:
        return device_bytes(self.llm, self.device)


_PLACEHOLDER_BASE: dict[torch.dtype, torch.Tensor] = {}


def host_placeholder(t: torch.Tensor) -> torch.Tensor:
    """A host tensor with t's shape and dtype over one shared element (zero strides): the parameter keeps
    its metadata for vLLM's code while holding no device memory and almost no host memory. (A meta tensor
    would be free, but `param.data` cannot be rebound across to the meta device.)"""
    base = _PLACEHOLDER_BASE.setdefault(t.dtype, torch.empty(1, dtype=t.dtype))
    return base.expand(t.shape)


def is_placeholder(t: torch.Tensor) -> bool:
    base = _PLACEHOLDER_BASE.get(t.dtype)
    return base is not None and t.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def clear_mla(model: torch.nn.Module) -> None:
    """Drop the absorbed MLA matrices (vllm-ascend: W_UV / W_UK_T; older: w_kc / w_vc)."""
    for impl in _mla_impls(model):
        for name in ("W_UV", "W_UK_T", "w_kc", "w_vc"):
            if hasattr(impl, name):
                setattr(impl, name, None)


def rebuild_mla(model: torch.nn.Module, act_dtype: torch.dtype | None = None) -> int:
    """Rebuild the absorbed MLA matrices from the freshly loaded kv_b_proj (they go stale otherwise).
    Returns the number of layers rebuilt."""
    n = 0
    for impl in _mla_impls(model):
        clear_mla_impl(impl)
        impl.process_weights_after_loading(act_dtype)
        n += 1
    return n


def clear_mla_impl(impl: Any) -> None:
    for name in ("W_UV", "W_UK_T", "w_kc", "w_vc"):
        if hasattr(impl, name):
            setattr(impl, name, None)


def _mla_impls(model: torch.nn.Module) -> Iterator[Any]:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None and hasattr(model, "layers"):
        layers = model.layers
    if isinstance(layers, torch.nn.Module):  # ModuleList, or a plain container of numbered layers
        layers = list(layers.children())
    for layer in layers or []:
        attn = getattr(getattr(layer, "self_attn", None), "mla_attn", None)
        if attn is not None and getattr(attn, "impl", None) is not None:
            yield attn.impl


def _tensors(llm: Any) -> Iterator[torch.Tensor]:
    model = model_of(llm)
    yield from model.parameters()
    yield from model.buffers()
    for impl in _mla_impls(model):
        for name in ("W_UV", "W_UK_T", "w_kc", "w_vc"):
            t = getattr(impl, name, None)
            if isinstance(t, torch.Tensor):
                yield t
    stack = list(model_runner_of(llm).kv_caches)
    for layer in _forward_context_layers(llm):
        stack.extend(getattr(layer, "kv_cache", []) or [])
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def device_bytes(llm: Any, device: torch.device | str | None = None) -> int:
    """Bytes held by the storages of the rollout's weights, buffers, MLA matrices and KV cache on the
    rollout's device; a storage shared by views is counted once. Offload placeholders are host tensors
    (on a CPU host they share one element per dtype, counted once like any storage)."""
    device = next(model_of(llm).parameters()).device if device is None else torch.device(device)
    seen: dict[tuple[str, int], int] = {}
    for t in _tensors(llm):
        if t.device.type != torch.device(device).type:
            continue
        storage = t.untyped_storage()
        if storage.nbytes() == 0:
            continue
        seen[(str(t.device), storage.data_ptr())] = storage.nbytes()
    return sum(seen.values())
