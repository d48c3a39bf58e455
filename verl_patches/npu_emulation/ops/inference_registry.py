"""The emulated inference ops as torch.library custom ops, under the namespaces vllm-ascend calls them by.

torch_npu's ops are dispatcher ops (`torch.ops.npu.*`, ATB's `torch.ops.atb.*`), and vllm-ascend's graph
mode relies on that: dynamo traces one as a single opaque node, shaped by its meta function, never looking
inside. Registering the plain-torch versions the same way keeps that contract on a CPU host: each op gets
its schema (the real op's, mutated arguments marked), the plain-torch implementation for every device
(CompositeExplicitAutograd: CPU tensors now, "npu" tensors alike) and a fake implementation for tracing.

`register_inference_ops()` does it once per process (a second call finds the ops and only returns them); the
stand-in torch_npu package calls it and exposes the result as torch_npu.<name> / torch_npu.atb.<name>, as
torch_npu does. Nothing happens at import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from verl_patches.npu_emulation.ops import infer_norm_rope, mla, paged_cache, prefetch, top_k_top_p


@dataclass(frozen=True)
class InferenceOp:
    namespace: str  # torch.ops.<namespace>
    schema: str  # "name(...) -> ..." or "name.overload(...) -> ..."
    impl: Callable[..., Any]
    fake: Callable[..., Any]
    exposed_as: str | None  # where torch_npu puts it: "name" (torch_npu.name), "atb.name", None (not exposed)

    @property
    def name(self) -> str:
        return self.schema.split("(", 1)[0].split(".")[0]

    @property
    def overload(self) -> str:
        head = self.schema.split("(", 1)[0]
        return head.split(".", 1)[1] if "." in head else "default"


@dataclass(frozen=True)
class ExposedOps:
    torch_npu: dict[str, Any] = field(default_factory=dict)  # torch_npu.<name> -> op packet
    atb: dict[str, Any] = field(default_factory=dict)  # torch_npu.atb.<name> -> op packet


# ---- fake (meta) implementations: output shapes and dtypes only -------------------------------------------
def _fia_fake(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **kw: Any) -> tuple[torch.Tensor, ...]:
    out_shape, lse_shape = mla.fia_output_shapes(
        query,
        value,
        block_table=kw.get("block_table"),
        num_heads=kw.get("num_heads", 1),
        num_key_value_heads=kw.get("num_key_value_heads", 0),
        input_layout=kw.get("input_layout", "BSH"),
        softmax_lse_flag=kw.get("softmax_lse_flag", False),
    )
    return query.new_empty(out_shape), query.new_empty(lse_shape, dtype=torch.float32)


def _kv_rmsnorm_rope_cache_fake(
    kv: torch.Tensor,
    gamma: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    index: torch.Tensor,
    k_cache: torch.Tensor,
    ckv_cache: torch.Tensor,
    **kw: Any,
) -> tuple[torch.Tensor, ...]:
    lead = tuple(kv.shape[:-1])
    return (
        k_cache,
        ckv_cache,
        kv.new_empty(lead + (kv.shape[-1] - gamma.shape[0],)),
        kv.new_empty(lead + (gamma.shape[0],)),
    )


def _add_rms_norm_fake(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, ...]:
    rstd_shape = tuple(x1.shape[: x1.dim() - gamma.dim()]) + (1,) * gamma.dim()
    work = torch.float32 if x1.dtype in (torch.float16, torch.bfloat16) else x1.dtype
    return torch.empty_like(x1), x1.new_empty(rstd_shape, dtype=work), torch.empty_like(x1)


def _ring_mla_fake(q_nope: torch.Tensor, *args: Any, **kw: Any) -> tuple[torch.Tensor, ...]:
    value, head_num = args[3], args[7]  # after q_rope, k_nope, k_rope; after mask, seqlen
    tokens = q_nope.shape[0]
    return q_nope.new_empty(tokens, head_num, value.shape[-1]), q_nope.new_empty(head_num, tokens, dtype=torch.float32)


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


def _like_first(x: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
    return torch.empty_like(x)


# ---- the real ops' schemas (mutated arguments marked) -------------------------------------------------------
_FIA_SCHEMA = (
    "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
    "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
    "Tensor? dequant_scale1=None, Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, "
    "Tensor? block_table=None, Tensor? query_padding_size=None, Tensor? kv_padding_size=None, "
    "Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
    "Tensor? value_antiquant_offset=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
    "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int pre_tokens=2147483647, "
    "int next_tokens=2147483647, str input_layout=\"BSH\", int num_key_value_heads=0, int sparse_mode=0, "
    "int inner_precise=0, int block_size=0, int antiquant_mode=0, bool softmax_lse_flag=False, "
    "int key_antiquant_mode=0, int value_antiquant_mode=0) -> (Tensor, Tensor)"
)
_KV_RMSNORM_ROPE_CACHE_SCHEMA = (
    "npu_kv_rmsnorm_rope_cache(Tensor kv, Tensor gamma, Tensor cos, Tensor sin, Tensor index, Tensor(a!) k_cache, "
    "Tensor(b!) ckv_cache, *, Tensor? k_rope_scale=None, Tensor? c_kv_scale=None, Tensor? k_rope_offset=None, "
    "Tensor? c_kv_offset=None, float epsilon=1e-05, str cache_mode=\"Norm\", bool is_output_kv=False) "
    "-> (Tensor(a!), Tensor(b!), Tensor, Tensor)"
)
_INTERLEAVE_ROPE_SCHEMA = "npu_interleave_rope(Tensor x, Tensor cos, Tensor sin) -> Tensor"
_RING_MLA_ARGS = (
    "Tensor q_nope, Tensor q_rope, Tensor k_nope, Tensor k_rope, Tensor value, Tensor mask, Tensor seqlen, "
    "int head_num, int kv_head_num, *, Tensor? pre_out=None, Tensor? prev_lse=None, float qk_scale=1.0, "
    "str? kernel_type=None, str? mask_type=None, str? input_layout=None, str? calc_type=None"
)
_PAGED_CACHE_LOAD_ARGS = (
    "Tensor key_cache, Tensor value_cache, Tensor block_table, Tensor context_lens, *, Tensor? seq_starts=None, "
    "bool cumsum=False"
)

INFERENCE_OPS: tuple[InferenceOp, ...] = (
    InferenceOp("npu", _FIA_SCHEMA, mla.npu_fused_infer_attention_score, _fia_fake, "npu_fused_infer_attention_score"),
    InferenceOp(
        "npu",
        _KV_RMSNORM_ROPE_CACHE_SCHEMA,
        infer_norm_rope.npu_kv_rmsnorm_rope_cache,
        _kv_rmsnorm_rope_cache_fake,
        "npu_kv_rmsnorm_rope_cache",
    ),
    InferenceOp(
        "npu", _INTERLEAVE_ROPE_SCHEMA, infer_norm_rope.npu_interleave_rope, _like_first, "npu_interleave_rope"
    ),
    InferenceOp(
        "npu",
        "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
        infer_norm_rope.npu_add_rms_norm,
        _add_rms_norm_fake,
        "npu_add_rms_norm",
    ),
    InferenceOp(
        "npu",
        "npu_prefetch(Tensor self, Tensor? dependency, int max_size, int offset=0) -> ()",
        prefetch.npu_prefetch,
        _returns_nothing,
        "npu_prefetch",
    ),
    InferenceOp(
        "npu",
        "npu_top_k_top_p(Tensor logits, Tensor p, Tensor k) -> Tensor",
        top_k_top_p.npu_top_k_top_p,
        _like_first,
        "npu_top_k_top_p",
    ),
    # vllm-ascend's V0 MLA backend (attention/attention.py) calls these two by torchair's namespace
    InferenceOp(
        "npu_inference",
        _KV_RMSNORM_ROPE_CACHE_SCHEMA,
        infer_norm_rope.npu_kv_rmsnorm_rope_cache,
        _kv_rmsnorm_rope_cache_fake,
        None,
    ),
    InferenceOp("npu_inference", _INTERLEAVE_ROPE_SCHEMA, infer_norm_rope.npu_interleave_rope, _like_first, None),
    InferenceOp(
        "atb",
        f"npu_ring_mla({_RING_MLA_ARGS}) -> (Tensor, Tensor)",
        mla.npu_ring_mla,
        _ring_mla_fake,
        "atb.npu_ring_mla",
    ),
    InferenceOp(
        "atb",
        f"npu_ring_mla.out({_RING_MLA_ARGS}, Tensor(a!) output, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))",
        mla.npu_ring_mla_out,
        _returns_outs,
        None,
    ),
    InferenceOp(
        "atb",
        f"npu_paged_cache_load({_PAGED_CACHE_LOAD_ARGS}) -> (Tensor, Tensor)",
        paged_cache.npu_paged_cache_load,
        _paged_cache_load_fake,
        "atb.npu_paged_cache_load",
    ),
    InferenceOp(
        "atb",
        f"npu_paged_cache_load.out({_PAGED_CACHE_LOAD_ARGS}, Tensor(a!) key, Tensor(b!) value) "
        "-> (Tensor(a!), Tensor(b!))",
        paged_cache.npu_paged_cache_load_out,
        _returns_outs,
        None,
    ),
    InferenceOp(
        "atb",
        "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_indices) -> ()",
        paged_cache.npu_reshape_and_cache,
        _returns_nothing,
        "_npu_reshape_and_cache",
    ),
    InferenceOp(
        "atb",
        "_npu_paged_attention_mla(Tensor query, Tensor key_cache, int num_kv_heads, int num_heads, float scale_value, "
        "Tensor block_table, Tensor context_lens, int mla_vheadsize, Tensor(a!) out) -> ()",
        mla.npu_paged_attention_mla,
        _returns_nothing,
        "_npu_paged_attention_mla",
    ),
    InferenceOp(
        "atb",
        "_npu_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox_style) -> ()",
        infer_norm_rope.npu_rotary_embedding,
        _returns_nothing,
        "_npu_rotary_embedding",
    ),
)

# Library handles keep the registrations alive (a collected Library takes its registrations with it).
_LIBRARIES: dict[str, torch.library.Library] = {}


def _is_defined(op: InferenceOp) -> bool:
    namespace = getattr(torch.ops, op.namespace)
    try:
        packet = getattr(namespace, op.name)
    except AttributeError:
        return False
    return op.overload in packet.overloads()


def _register(op: InferenceOp) -> None:
    lib = _LIBRARIES.get(op.namespace)
    if lib is None:
        # FRAGMENT: other emulated ops (MoE, the npu device) add to the same namespaces
        lib = _LIBRARIES[op.namespace] = torch.library.Library(op.namespace, "FRAGMENT")
    lib.define(op.schema)
    qualified = f"{op.name}.{op.overload}" if op.overload != "default" else op.name
    lib.impl(qualified, op.impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{op.namespace}::{qualified}", op.fake, lib=lib)


def register_inference_ops() -> ExposedOps:
    """Define every op of INFERENCE_OPS not yet defined in this process; return where torch_npu exposes them
    (the op packets, torch.ops.<namespace>.<name>, as torch_npu exposes its own)."""
    exposed = ExposedOps()
    for op in INFERENCE_OPS:
        if not _is_defined(op):
            _register(op)
        if op.exposed_as is None:
            continue
        packet = getattr(getattr(torch.ops, op.namespace), op.name)
        if op.exposed_as.startswith("atb."):
            exposed.atb[op.exposed_as.split(".", 1)[1]] = packet
        else:
            exposed.torch_npu[op.exposed_as] = packet
    return exposed
