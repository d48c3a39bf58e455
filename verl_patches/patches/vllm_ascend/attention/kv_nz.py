"""F4 (vendor's 0001-FIX-KVcache-NZ.patch) as a runtime change of vllm-ascend 0.9.1's MLA, never `git apply`.

Two corrections for the NZ-layout KV cache in TorchAir graph mode:
1. `AscendMLAImpl.exec_kv_prefill` writes the cache with `npu_kv_rmsnorm_rope_cache(cache_mode=...)`:
   with `enable_kv_nz` it must be "PA_NZ" (upstream passes "PA_BLK_NZ", a different layout).
2. In graph mode the fused `npu_kv_rmsnorm_rope_cache` has already written the cache of a whole-prompt
   prefill; the extra `torch_npu._npu_reshape_and_cache` call in `AscendMLAImpl.forward`'s PrefillNoCache
   branch would write it again in ND layout and corrupt an NZ cache. The call in its ChunkedPrefill-with-decode
   branch is different: it is the decode tokens' only KV write, so dropping it loses them, and that step's
   `npu_paged_cache_load` reads ND only. F4 is therefore refused together with chunked prefill
   (trainer/config_checks.kv_nz_problems), and without chunked prefill vllm-ascend never marks a step
   ChunkedPrefill (model_runner_v1.py:987: the Ascend scheduler on without chunking gives PrefillCacheHit).

When: only where the profile turns on both TorchAir graph mode and `enable_kv_nz` (rollout/kv_nz_switch.py:
the launcher sets `VERL_PATCHES_KV_NZ` from the composed config; the engine build refuses an engine whose
config and flag disagree). Under that condition both corrections are static facts of the process, which is what
keeps this patch traceable by dynamo with `fullgraph=True` (vllm-ascend compiles the model that calls
these functions, `capture_model`): no scope marking, no context manager, no thread-local, no wrapper
around `forward`. In mla_v1 at the pin:
  * "PA_BLK_NZ" is passed only by `exec_kv_prefill` with `enable_kv_nz` -> every one becomes "PA_NZ";
  * `_npu_reshape_and_cache` is called only in `forward`: twice in the `torchair_graph_enabled` branch
    (PrefillNoCache, the ND re-write to drop; ChunkedPrefill, unreachable without chunked prefill, see 2.)
    and once in the eager `else` branch, which graph mode never reaches -> with graph mode on and chunked
    prefill off, every call reached is one to drop.
Both facts are fingerprinted (`forward`, `exec_kv_prefill`, `exec_kv`). mla_v1's module-level name
`torch_npu` becomes a `KvNzTorchNpu`: a module object whose attributes are the real torch_npu's, read
through at call time, except those two functions. The kernels are NPU-only: on CPU this is checked
structurally (which calls reach the kernels, with which modes) and traced with `fullgraph=True`.
"""

from __future__ import annotations

import types
from typing import Any


class KvNzTorchNpu(types.ModuleType):
    """Stands for `torch_npu` inside vllm_ascend.attention.mla_v1 only (a module, so dynamo reads its
    attributes as it reads the real torch_npu's)."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(f"{getattr(real, '__name__', 'torch_npu')}[kv_nz]")
        self.__dict__["_real"] = real
        self.__dict__["npu_kv_rmsnorm_rope_cache"] = _kv_rmsnorm_rope_cache_pa_nz(real)
        self.__dict__["_npu_reshape_and_cache"] = _skip_nd_rewrite

    def __getattr__(self, name: str) -> Any:  # only for names not set above
        return getattr(self.__dict__["_real"], name)


def _kv_rmsnorm_rope_cache_pa_nz(real: Any) -> Any:
    def npu_kv_rmsnorm_rope_cache(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("cache_mode") == "PA_BLK_NZ":
            kwargs["cache_mode"] = "PA_NZ"
        return real.npu_kv_rmsnorm_rope_cache(*args, **kwargs)

    return npu_kv_rmsnorm_rope_cache


def _skip_nd_rewrite(*args: Any, **kwargs: Any) -> None:
    return None  # graph mode: the fused npu_kv_rmsnorm_rope_cache already wrote the (NZ) cache


def proxied_torch_npu(original: Any) -> Any:
    return original if isinstance(original, KvNzTorchNpu) else KvNzTorchNpu(original)
