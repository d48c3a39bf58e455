"""The emulated inference ops as dispatcher ops, under the namespaces vllm-ascend calls them by.

torch_npu's ops are dispatcher ops (`torch.ops.npu.*`, ATB's `torch.ops.atb.*`, TorchAir's `torch.ops.npu_inference.*`),
and vllm-ascend's graph mode relies on that: dynamo traces one as a single opaque node, shaped by its Meta
function, never looking inside. Each op here is registered the same way by `wheel_contract.registration`: the
schema the pinned torch_npu wheel registers, the wheel's Meta function (where it has one; the fakes below stand in
only for the ATB ops, which the wheel ships without Meta functions), the documented limits, and the plain-torch
kernel for every device. The one change to a wheel schema (npu_kv_rmsnorm_rope_cache's alias marks) is declared,
with its reason, in `wheel_contract.deviations`.

`register_inference_ops()` does it once per process (a second call finds the ops and only returns them); the
stand-in torch_npu package calls it and exposes the result as torch_npu.<name> / torch_npu.atb.<name>, where the
wheel's torch_npu exposes them. Nothing happens at import.
"""

from __future__ import annotations

from typing import Any

import torch

from verl_patches.npu_emulation.ops import (
    apply_rotary_pos_emb,
    infer_norm_rope,
    mla,
    paged_attention,
    paged_cache,
    prefetch,
    top_k_top_p,
)
from verl_patches.npu_emulation.wheel_contract.registration import Emulated, Registered, register


# ---- fakes for the ATB ops (the wheel has no Meta functions for them): output shapes and dtypes only ---------
def _ring_mla_fake(q_nope: torch.Tensor, *args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
    value = args[3]  # after q_rope, k_nope, k_rope
    tokens, heads = q_nope.shape[0], q_nope.shape[1]
    return q_nope.new_empty(tokens, heads, value.shape[-1]), q_nope.new_empty(heads, tokens, dtype=torch.float32)


def _paged_cache_load_fake(key_cache: torch.Tensor, value_cache: torch.Tensor, *args: Any, **kw: Any) -> tuple:
    tokens = torch.library.get_ctx().new_dynamic_size()  # the sum of context_lens, known only at run time
    return (
        key_cache.new_empty(tokens, *key_cache.shape[2:]),
        value_cache.new_empty(tokens, *value_cache.shape[2:]),
    )


def _returns_outs(*args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
    return tuple(kw[name] for name in ("output", "softmax_lse", "key", "value") if name in kw)


def _returns_nothing(*args: Any, **kw: Any) -> None:
    return None


INFERENCE_OPS: tuple[Emulated, ...] = (
    Emulated("npu::npu_fused_infer_attention_score", mla.npu_fused_infer_attention_score),
    Emulated("npu::npu_kv_rmsnorm_rope_cache", infer_norm_rope.npu_kv_rmsnorm_rope_cache),
    Emulated("npu::npu_interleave_rope", infer_norm_rope.npu_interleave_rope),
    Emulated("npu::npu_add_rms_norm", infer_norm_rope.npu_add_rms_norm),
    Emulated("npu::npu_prefetch", prefetch.npu_prefetch),
    Emulated("npu::npu_top_k_top_p", top_k_top_p.npu_top_k_top_p),
    # vllm-ascend's V0 MLA backend (attention/attention.py) calls these two by TorchAir's namespace
    Emulated("npu_inference::npu_kv_rmsnorm_rope_cache", infer_norm_rope.npu_kv_rmsnorm_rope_cache),
    Emulated("npu_inference::npu_interleave_rope", infer_norm_rope.npu_interleave_rope),
    Emulated("atb::npu_ring_mla", mla.npu_ring_mla, fallback_fake=_ring_mla_fake),
    Emulated("atb::npu_ring_mla.out", mla.npu_ring_mla_out, fallback_fake=_returns_outs),
    Emulated("atb::npu_paged_cache_load", paged_cache.npu_paged_cache_load, fallback_fake=_paged_cache_load_fake),
    Emulated("atb::npu_paged_cache_load.out", paged_cache.npu_paged_cache_load_out, fallback_fake=_returns_outs),
    Emulated("atb::_npu_reshape_and_cache", paged_cache.npu_reshape_and_cache, fallback_fake=_returns_nothing),
    Emulated("atb::_npu_paged_attention_mla", mla.npu_paged_attention_mla, fallback_fake=_returns_nothing),
    Emulated("atb::_npu_rotary_embedding", infer_norm_rope.npu_rotary_embedding, fallback_fake=_returns_nothing),
    # for models without MLA (vllm-ascend's own engine tests on small Qwen2/OPT models; not on A3's DeepSeek path)
    Emulated("npu::npu_apply_rotary_pos_emb", apply_rotary_pos_emb.npu_apply_rotary_pos_emb),
    Emulated("atb::_npu_flash_attention", paged_attention.npu_flash_attention, fallback_fake=_returns_nothing),
    Emulated(
        "atb::_npu_flash_attention_qlens", paged_attention.npu_flash_attention_qlens, fallback_fake=_returns_nothing
    ),
    Emulated("atb::_npu_paged_attention", paged_attention.npu_paged_attention, fallback_fake=_returns_nothing),
    Emulated(
        "atb::_npu_paged_attention_splitfuse",
        paged_attention.npu_paged_attention_splitfuse,
        fallback_fake=_returns_nothing,
    ),
)


def register_inference_ops() -> Registered:
    """Define every op of INFERENCE_OPS not yet defined in this process; returns the op packets by where torch_npu
    exposes them ("name" for torch_npu.name, "atb.name" for torch_npu.atb.name)."""
    return register(INFERENCE_OPS)
