"""F4 (vendor's 0001-FIX-KVcache-NZ.patch) as a runtime change of vllm-ascend 0.9.1's MLA, never `git apply`.

Two corrections for the NZ-layout KV cache in TorchAir graph mode:
1. `AscendMLAImpl.exec_kv_prefill` writes the cache with `npu_kv_rmsnorm_rope_cache(cache_mode=...)`:
   with `enable_kv_nz` it must be "PA_NZ" (upstream passes "PA_BLK_NZ", a different layout).
2. In graph mode the fused `npu_kv_rmsnorm_rope_cache` has already written the cache; the extra
   `torch_npu._npu_reshape_and_cache` calls in `AscendMLAImpl.forward` (PrefillNoCache and
   ChunkedPrefill-with-decode branches) would write it again in ND layout and corrupt an NZ cache.
   Only the eager path (graph mode off) keeps `_npu_reshape_and_cache`.

How, without copying upstream bodies: mla_v1's module-level name `torch_npu` becomes `KvNzTorchNpu`, a
proxy that forwards every attribute to the real torch_npu, except that (1) inside `exec_kv_prefill`
with `enable_kv_nz` a "PA_BLK_NZ" cache mode is passed as "PA_NZ", and (2) inside `forward` with TorchAir
graph mode `_npu_reshape_and_cache` does nothing. The two methods are wrapped to mark those scopes
(thread-local, so nothing leaks across calls). The kernels are NPU-only: on CPU this is checked
structurally (which calls reach the kernels, with which modes), not numerically.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

_scope = threading.local()


@contextlib.contextmanager
def _marked(name: str, on: bool) -> Iterator[None]:
    before = getattr(_scope, name, False)
    setattr(_scope, name, on)
    try:
        yield
    finally:
        setattr(_scope, name, before)


class KvNzTorchNpu:
    """Stands for `torch_npu` inside vllm_ascend.attention.mla_v1 only."""

    def __init__(self, real: Any) -> None:
        object.__setattr__(self, "_real", real)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def npu_kv_rmsnorm_rope_cache(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(_scope, "prefill_nz", False) and kwargs.get("cache_mode") == "PA_BLK_NZ":
            kwargs["cache_mode"] = "PA_NZ"
        return self._real.npu_kv_rmsnorm_rope_cache(*args, **kwargs)

    def _npu_reshape_and_cache(self, *args: Any, **kwargs: Any) -> Any:
        if getattr(_scope, "graph_forward", False):
            return None  # the fused op already wrote the (NZ) cache in graph mode
        return self._real._npu_reshape_and_cache(*args, **kwargs)


def proxied_torch_npu(original: Any) -> KvNzTorchNpu:
    return original if isinstance(original, KvNzTorchNpu) else KvNzTorchNpu(original)


def wrap_exec_kv_prefill(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def exec_kv_prefill(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _marked("prefill_nz", bool(getattr(self, "enable_kv_nz", False))):
            return original(self, *args, **kwargs)

    return exec_kv_prefill


def wrap_forward(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _marked("graph_forward", bool(getattr(self, "torchair_graph_enabled", False))):
            return original(self, *args, **kwargs)

    return forward
