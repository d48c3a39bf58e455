"""The rollout kernels' documented limits, as data: op -> the checks the real kernel makes, each quoting the
wheel's documentation (``torch_npu/_op_plugin_docs.py``, ``torch_npu/op_plugin/atb/_atb_api_docs.py``).

The registration (`registration`) applies `check` to the bound arguments before the plain-torch kernel runs,
so the kernels in ``ops/`` stay plain math. A refused input raises `LimitRefused` naming the op, the argument,
what was given and what the real kernel requires, with the documentation's own words. Two declared exceptions
(`cpu_proof`) relax some limits on a CPU host and nothing else: `FP32_RUN` lets float32 through where the list
has bf16/fp16, `SCALED_MODEL` lets the scaled-down model's sizes through.

Ops of the emulation without an entry here have no limit written in the wheel's documentation (the MC2
dispatch/combine pairs, npu_kv_rmsnorm_rope_cache, npu_moe_gating_top_k, npu_add_rms_norm, npu_interleave_rope,
npu_moe_re_routing, and the ATB ops _npu_reshape_and_cache, _npu_paged_attention_mla, _npu_rotary_embedding are
not documented in torch_npu 2.5.1.post1); their Meta functions' checks still apply (`registration`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verl_patches.npu_emulation.wheel_contract.cpu_proof import FP32_RUN, SCALED_MODEL, CpuProofException, in_effect

OPS_DOC = "torch_npu/_op_plugin_docs.py"
ATB_DOC = "torch_npu/op_plugin/atb/_atb_api_docs.py"
Args = Mapping[str, Any]


class LimitRefused(ValueError):
    """An input the real kernel refuses; one line naming the op, the argument and the documented requirement."""


@dataclass(frozen=True)
class Limit:
    arg: str  # the argument the message names
    requirement: str  # what the real kernel requires, in English
    quote: str  # the documentation's words (verbatim: a test finds them in the wheel's file)
    doc: str  # the documentation file; the section is the op's own docstring there
    holds: Callable[[Args], bool]
    when: Callable[[Args], bool] = lambda a: True  # the limit applies only in this case
    exception: CpuProofException | None = None
    relaxed: Callable[[Args], bool] = lambda a: True  # what holds instead while the exception is in effect

    def refusal(self, op: str, args: Args) -> str | None:
        if not self.when(args) or self.holds(args):
            return None
        if self.exception is not None and in_effect(self.exception) and self.relaxed(args):
            return None
        text = (
            f"{op}: {self.arg} {_describe(args.get(self.arg.split('[')[0].split('.')[0]))}: the real kernel requires "
            f"{self.requirement} ({self.doc}, {op.split('::')[-1]}: \"{self.quote}\")"
        )
        if self.exception is not None:
            text += f"; accepted on a CPU host only while the CPU proof's {self.exception.name} exception is in effect"
        return text


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"is a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return f"is a list of {len(value)} tensors ({value[0].dtype}, first of shape {tuple(value[0].shape)})"
    return f"is {value!r}"


# ---- small builders --------------------------------------------------------------------------------------
def _present(name: str) -> Callable[[Args], bool]:
    return lambda a: a.get(name) is not None


def dtypes(arg: str, allowed: Sequence[torch.dtype], quote: str, doc: str = OPS_DOC, when=lambda a: True) -> Limit:
    """``arg``'s dtype is one of ``allowed``; float32 is let through under FP32_RUN where bf16/fp16 are listed."""
    names = ", ".join(str(d).replace("torch.", "") for d in allowed)
    fp32_relaxable = torch.float32 not in allowed and (torch.bfloat16 in allowed or torch.float16 in allowed)

    def dtype_of(a: Args) -> torch.dtype | None:
        v = a.get(arg)
        if isinstance(v, (list, tuple)):
            v = v[0] if v else None
        return v.dtype if isinstance(v, torch.Tensor) else None

    return Limit(
        arg=arg,
        requirement=f"dtype {names}",
        quote=quote,
        doc=doc,
        holds=lambda a: dtype_of(a) in allowed,
        when=lambda a: a.get(arg) is not None and when(a),
        exception=FP32_RUN if fp32_relaxable else None,
        relaxed=lambda a: dtype_of(a) == torch.float32,
    )


def one_of(arg: str, values: Sequence[Any], quote: str, doc: str = OPS_DOC, when=lambda a: True) -> Limit:
    return Limit(arg, f"one of {list(values)}", quote, doc, lambda a: a.get(arg) in values, when)


def size(
    arg: str, requirement: str, holds: Callable[[Args], bool], quote: str, doc: str = OPS_DOC, when=lambda a: True
) -> Limit:
    """A limit on the model's sizes (heads, head dims, row widths): relaxed by SCALED_MODEL."""
    return Limit(arg, requirement, quote, doc, holds, when, SCALED_MODEL)


F16_BF16 = (torch.float16, torch.bfloat16)
F16_BF16_F32 = (*F16_BF16, torch.float32)
F16_BF16_INT8 = (*F16_BF16, torch.int8)


# ---- npu_fused_infer_attention_score -------------------------------------------------------------------------
def _q_heads_dim_seq(a: Args) -> tuple[int | None, int | None, int | None]:
    """(N, D, S) of the query as its input_layout reads it (None where the layout does not say)."""
    q, layout = a["query"], a["input_layout"]
    if layout in ("BNSD", "BNSD_BSND") and q.dim() == 4:
        return q.shape[1], q.shape[3], q.shape[2]
    if layout == "BSND" and q.dim() == 4:
        return q.shape[2], q.shape[3], q.shape[1]
    if layout == "BSH" and q.dim() == 3:
        return a["num_heads"], q.shape[2] // max(a["num_heads"], 1), q.shape[1]
    if layout == "TND" and q.dim() == 3:
        return q.shape[1], q.shape[2], None
    return None, None, None


def _rope(a: Args) -> bool:
    return a.get("query_rope") is not None or a.get("key_rope") is not None


def _q_seq(a: Args) -> int | None:
    return _q_heads_dim_seq(a)[2]


_FIA_ROPE_SHAPES = "配置时要求query的S为1-16、N为32、64、128, D为512, shape中B、N、S与query一致, D为64"
_FIA_KEY_ROPE = "key_rope的数据类型、数据格式与key一致, 配置时要求key的N为1, D为512"
_FIA_PA_BLOCK = "该场景下, 必须开启PageAttention, 此时block_size支持16、128"

FIA = (
    dtypes(
        "query",
        F16_BF16_INT8,
        "query: Tensor类型, attention结构的Query输入, 数据类型支持float16、bfloat16、int8",
    ),
    *(
        dtypes(
            arg,
            (*F16_BF16_INT8, torch.int32),
            "Atlas A3 训练系列产品: 数据类型支持float16、bfloat16、int8、int4(int32)",
        )
        for arg in ("key", "value")
    ),
    *(
        dtypes(
            f"{t}_rope",
            F16_BF16,
            f"表示MLA(Multi-head Latent Attention)结构中的{t}的rope信息, 数据类型支持float16、bfloat16",
        )
        for t in ("query", "key")
    ),
    one_of(
        "input_layout",
        ("BSH", "BSND", "BNSD", "BNSD_BSND", "TND"),
        "Atlas A3 训练系列产品: 支持BSH、BSND、BNSD、BNSD_BSND、TND",
    ),
    Limit(
        "num_key_value_heads",
        "num_heads divisible by num_key_value_heads, their ratio at most 64",
        "需要满足num_heads整除num_key_value_heads, num_heads与num_key_value_heads的比值不能大于64",
        OPS_DOC,
        lambda a: a["num_heads"] % a["num_key_value_heads"] == 0 and a["num_heads"] // a["num_key_value_heads"] <= 64,
        # the MLA (rope) case documents its own head counts: 32/64/128 query heads over 1 key head
        when=lambda a: a["num_key_value_heads"] > 0 and not _rope(a),
    ),
    one_of("sparse_mode", (0, 1, 2, 3, 4), "参数sparse_mode当前仅支持值为0、1、2、3、4的场景"),
    Limit(
        "query_rope",
        "query_rope and key_rope given together or not at all",
        "query_rope和key_rope要求同时配置或同时不配置",
        OPS_DOC,
        lambda a: (a.get("query_rope") is None) == (a.get("key_rope") is None),
    ),
    size(
        "num_heads",
        "32, 64 or 128 query heads (per rank) with query_rope",
        lambda a: a["num_heads"] in (32, 64, 128),
        _FIA_ROPE_SHAPES,
        when=_rope,
    ),
    size(
        "query",
        "head size (D) 512 with query_rope",
        lambda a: _q_heads_dim_seq(a)[1] in (None, 512),
        _FIA_ROPE_SHAPES,
        when=_rope,
    ),
    size(
        "query_rope",
        "head size (D) 64",
        lambda a: a["query_rope"].shape[-1] == 64,
        _FIA_ROPE_SHAPES,
        when=_present("query_rope"),
    ),
    Limit(
        "query",
        "a query sequence length (S) of 1 to 16 with query_rope",
        _FIA_ROPE_SHAPES,
        OPS_DOC,
        lambda a: _q_seq(a) is None or 1 <= _q_seq(a) <= 16,
        when=_rope,
    ),
    Limit(
        "num_key_value_heads",
        "1 key head with key_rope",
        _FIA_KEY_ROPE,
        OPS_DOC,
        lambda a: a["num_key_value_heads"] == 1,
        when=_rope,
    ),
    size("key", "head size (D) 512 with key_rope", lambda a: a["key"].shape[-1] == 512, _FIA_KEY_ROPE, when=_rope),
    Limit(
        "block_table",
        "a block table (PageAttention) with query_rope",
        _FIA_PA_BLOCK,
        OPS_DOC,
        _present("block_table"),
        when=_rope,
    ),
    Limit(
        "block_size",
        "16 or 128 with query_rope",
        _FIA_PA_BLOCK,
        OPS_DOC,
        lambda a: a["block_size"] in (16, 128),
        when=_rope,
    ),
    Limit(
        "sparse_mode",
        "sparse_mode 0 without atten_mask when S is 1, sparse_mode 3 with atten_mask when S > 1 (with query_rope)",
        "Q_S等于1时只支持sparse=0且不传mask, Q_S大于1时只支持sparse=3且传入mask",
        OPS_DOC,
        lambda a: (
            (a["sparse_mode"] == 0 and a.get("atten_mask") is None)
            if _q_seq(a) == 1
            else (a["sparse_mode"] == 3 and a.get("atten_mask") is not None)
        ),
        when=lambda a: _rope(a) and _q_seq(a) is not None,
    ),
    Limit(
        "actual_seq_lengths_kv",
        "actual_seq_lengths_kv given with page attention (block_table)",
        "page attention场景下, 必须传入actual_seq_lengths_kv",
        OPS_DOC,
        _present("actual_seq_lengths_kv"),
        when=_present("block_table"),
    ),
    Limit(
        "block_table",
        "a 2-D block_table whose first dimension is the batch",
        "page attention场景下, block_table必须为二维, 第一维长度需等于B",
        OPS_DOC,
        lambda a: a["block_table"].dim() == 2,
        when=_present("block_table"),
    ),
)


# ---- npu_top_k_top_p -------------------------------------------------------------------------------------------
def _rows(a: Args) -> int:
    return a["logits"].shape[0]


def _one_per_row(arg: str) -> Limit:
    """``arg`` holds one value per row of logits (p and k document the same rule)."""
    return Limit(
        arg,
        "a 1-D tensor of logits.size(0) values",
        "shape支持1维且需要与logits的首轴相同",
        OPS_DOC,
        lambda a: a[arg].dim() == 1 and a[arg].shape[0] == _rows(a),
    )


TOP_K_TOP_P = (
    Limit(
        "logits", "a 2-D tensor", "logits(torch.Tensor): 输入张量，支持2维", OPS_DOC, lambda a: a["logits"].dim() == 2
    ),
    dtypes(
        "logits",
        (torch.bfloat16, torch.float16, torch.float32),
        "数据类型支持torch.bfloat16, torch.float16, torch.float32",
    ),
    Limit("p", "logits' dtype", "数据类型需要与logits一致", OPS_DOC, lambda a: a["p"].dtype == a["logits"].dtype),
    _one_per_row("p"),
    Limit(
        "p",
        "values in [0, 1]",
        "表示top-p的阈值，值域为[0, 1]",
        OPS_DOC,
        lambda a: bool(((a["p"] >= 0) & (a["p"] <= 1)).all()),
    ),
    dtypes("k", (torch.int32,), "数据类型支持torch.int32"),
    _one_per_row("k"),
    Limit(
        "k",
        "values in [1, 1024]",
        "表示top-k的阈值，值域为[1, 1024]",
        OPS_DOC,
        lambda a: a["k"].numel() == 0 or (int(a["k"].min()) >= 1 and int(a["k"].max()) <= 1024),
    ),
    Limit(
        "k",
        "a largest value at most logits.size(1)",
        "且最大值需要小于等于logits.size(1)",
        OPS_DOC,
        lambda a: a["k"].numel() == 0 or int(a["k"].max()) <= a["logits"].shape[1],
    ),
)


# ---- npu_grouped_matmul --------------------------------------------------------------------------------------
def _tensors(a: Args, name: str) -> list[torch.Tensor]:
    return list(a.get(name) or [])


GROUPED_MATMUL = (
    *(
        Limit(arg, "at most 128 tensors", "列表最大长度为128", OPS_DOC, lambda a, arg=arg: len(_tensors(a, arg)) <= 128)
        for arg in ("x", "weight")
    ),
    dtypes(
        "x",
        (torch.float16, torch.float32, torch.bfloat16, torch.int8),
        "torch.float16、torch.float32、torch.bfloat16和torch.int8",
    ),
    Limit(
        "weight",
        "2-D or 3-D tensors",
        "每个张量支持2维或3维输入",
        OPS_DOC,
        lambda a: all(w.dim() in (2, 3) for w in _tensors(a, "weight")),
    ),
    one_of("split_item", (0, 1, 2, 3), "0/1: 输出为多个张量, 数量与weight相同"),
    Limit(
        "x",
        "2-D tensors unless split_item is 0 (then 2 to 6 dimensions)",
        "当split_item=0时, 张量支持2至6维输入; 其他情况下, 张量仅支持2维输入",
        OPS_DOC,
        lambda a: all((2 <= x.dim() <= 6) if a["split_item"] == 0 else x.dim() == 2 for x in _tensors(a, "x")),
    ),
    one_of(
        "group_type",
        (-1, 0),
        "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 当前支持取-1、0",
        when=_present("group_list"),
    ),
    one_of("group_list_type", (0, 1), "可取值0或1", when=_present("group_list")),
    dtypes("group_list", (torch.int64,), "用于指定分组的索引, 表示x的第0维矩阵乘法的索引情况. 数据类型支持torch.int64"),
    Limit(
        "group_list",
        "non-negative and non-decreasing when group_list_type is 0 (cumulative), non-negative when 1",
        "当group_list_type为0时, group_list必须为非负单调非递减数列",
        OPS_DOC,
        lambda a: (
            bool((a["group_list"] >= 0).all())
            and (a["group_list_type"] != 0 or bool((a["group_list"][1:] >= a["group_list"][:-1]).all()))
        ),
        when=_present("group_list"),
    ),
    one_of("act_type", (0, 1, 2, 3, 4, 5), "Atlas A2 训练系列产品/Atlas 800I A2 推理产品: 取值范围为0-5"),
)


# ---- MoE routing ops -------------------------------------------------------------------------------------------
GATING_TOP_K_SOFTMAX = (
    Limit(
        "x", "a 2-D or 3-D tensor", "表示待计算的输入要求是一个2D/3D的Tensor", OPS_DOC, lambda a: a["x"].dim() in (2, 3)
    ),
    dtypes("x", F16_BF16_F32, "数据类型支持float16、bfloat16、float32, 数据格式要求为ND"),
    Limit(
        "k",
        "0 < k <= x.size(-1) and k <= 1024",
        "大小为0<k<=x的-1轴大小, k<=1024",
        OPS_DOC,
        lambda a: 0 < a["k"] <= min(a["x"].shape[-1], 1024),
    ),
)
INIT_ROUTING = (
    Limit("x", "a 2-D tensor", "要求为一个2D的Tensor, shape为 (NUM_ROWS, H)", OPS_DOC, lambda a: a["x"].dim() == 2),
    dtypes(
        "x",
        F16_BF16_F32,
        "数据类型支持float16、bfloat16、float32, 数据格式要求为ND. shape大小需要小于2^24",
    ),
    dtypes("row_idx", (torch.int32,), "指示每个位置对应的原始行位置, shape要求与expert_idx一致. 数据类型支持int32"),
    dtypes("expert_idx", (torch.int32,), "要求是一个2D的shape (NUM_ROWS, K), 数据类型支持int32"),
)
COMPUTE_EXPERT_TOKENS = (
    Limit(
        "sorted_expert_for_source_row",
        "a 1-D tensor",
        "要求是一个1D的Tensor, 数据类型支持int32",
        OPS_DOC,
        lambda a: a["sorted_expert_for_source_row"].dim() == 1,
    ),
    dtypes("sorted_expert_for_source_row", (torch.int32,), "要求是一个1D的Tensor, 数据类型支持int32"),
)
FINALIZE_ROUTING = (
    dtypes(
        "expanded_permuted_rows",
        F16_BF16_F32,
        "要求是一个2D的Tensor, 数据类型支持float16、bfloat16、float32",
    ),
    dtypes(
        "expanded_src_to_dst_row", (torch.int32,), "保存每个专家处理结果的索引, 要求是一个1D的Tensor, 数据类型支持int32"
    ),
    one_of("drop_pad_mode", (0, None), "表示是否支持丢弃模式, 取值范围为0"),
)

PREFETCH = (
    Limit("max_size", "a value > 0", "取值需大于0, 表示权重预取的最大size", OPS_DOC, lambda a: a["max_size"] > 0),
    Limit("offset", "a value >= 0", "默认值0, 取值大于等于0", OPS_DOC, lambda a: a["offset"] >= 0),
)


# ---- ATB: npu_ring_mla, npu_paged_cache_load --------------------------------------------------------------------
def _ring_seq_ok(a: Args) -> bool:
    seqlen = a["seqlen"]
    q = seqlen if seqlen.dim() == 1 else seqlen[0]
    kv = seqlen if seqlen.dim() == 1 else seqlen[1]
    return bool(((q != 0) & ((kv >= q) | (kv == 0))).all())


def _head_size(arg: str, width: int) -> Limit:
    """``arg`` is [qNTokens, headNum, width] (the query's no-position and rotary parts document one rule each)."""
    return size(
        arg,
        f"head size {width} ([qNTokens, headNum, {width}])",
        lambda a: a[arg].shape[-1] == width,
        f"shape为[qNTokens, headNum, {width}]",
        ATB_DOC,
    )


RING_MLA = (
    *(
        dtypes(arg, F16_BF16, quote, ATB_DOC)
        for arg, quote in (
            ("q_nope", "q_nope: Device Tensor,无位置编码query矩阵，支持float16/bf16"),
            ("q_rope", "q_rope: Device Tensor,query旋转位置编码分量，支持float16/bf16"),
            ("k_nope", "k_nope: Device Tensor,无位置编码key矩阵，支持float16/bf16"),
            ("k_rope", "k_rope: Device Tensor,key旋转位置编码，支持float16/bf16"),
            ("value", "value: Device Tensor,value矩阵，支持float16/bf16"),
        )
    ),
    _head_size("q_nope", 128),
    _head_size("q_rope", 64),
    one_of("input_layout", (None, "type_bsnd"), "inputLayout仅支持TYPE_BSND", ATB_DOC),
    one_of("mask_type", (None, "no_mask", "mask_type_triu"), "mask类型，当前支持no_mask、mask_type_triu", ATB_DOC),
    one_of(
        "calc_type",
        (None, "calc_type_default", "calc_type_first_ring"),
        "当前支持calc_type_default、calc_type_first_ring",
        ATB_DOC,
    ),
    one_of(
        "kernel_type",
        (None, "kernel_type_default", "kernel_type_high_precision"),
        "算子内核精度类型，当前支持kernel_type_default、kernel_type_high_precision",
        ATB_DOC,
    ),
    Limit(
        "seqlen",
        "for every batch a non-zero query length and a key length at least it (or zero), under mask_type_triu",
        "对于每个batch，kvSeqLen >= qSeqLen或者kvSeqLen为0；qSeqLen不可为0",
        ATB_DOC,
        _ring_seq_ok,
        # read as a limit of the causal case: vllm-ascend's chunked prefill attends each context chunk without a
        # mask (calc_type_default) with fewer keys than queries, the A3 path every profile runs
        when=lambda a: a.get("mask_type") == "mask_type_triu",
    ),
)


def _row_bytes_aligned(cache: str) -> Callable[[Args], bool]:
    return lambda a: (a[cache].shape[-2] * a[cache].shape[-1] * a[cache].element_size()) % 32 == 0


PAGED_CACHE_LOAD = (
    *(
        dtypes(
            f"{kv}_cache",
            F16_BF16_INT8,
            f"{kv}_cache: Device Tensor, cache好的{kv}, 支持float16/bf16/int8数据类型",
            ATB_DOC,
        )
        for kv in ("key", "value")
    ),
    dtypes("block_table", (torch.int32,), "记录每个batch的sequence在kvcache中的blockId，支持int32数据类型", ATB_DOC),
    dtypes("context_lens", (torch.int32,), "每个batch序列长度或每个batch序列长度的累加和，支持int32数据类型", ATB_DOC),
    dtypes("seq_starts", (torch.int32,), "每个batch在blocktable中对应的起始位置, shape为[batch],支持int32", ATB_DOC),
    *(
        size(
            f"{kv}_cache",
            f"num_heads * head_size_{kv[0]} a multiple of 32 bytes",
            _row_bytes_aligned(f"{kv}_cache"),
            f"{kv}_cache的shape信息中num_heads*head_size_{kv[0]} 需要是32B对齐",
            ATB_DOC,
        )
        for kv in ("key", "value")
    ),
)


LIMITS: dict[str, tuple[Limit, ...]] = {
    "npu::npu_fused_infer_attention_score": FIA,
    "npu::npu_top_k_top_p": TOP_K_TOP_P,
    "npu::npu_grouped_matmul": GROUPED_MATMUL,
    "npu::npu_moe_gating_top_k_softmax": GATING_TOP_K_SOFTMAX,
    "npu::npu_moe_init_routing": INIT_ROUTING,
    "npu::npu_moe_compute_expert_tokens": COMPUTE_EXPERT_TOKENS,
    "npu::npu_moe_finalize_routing": FINALIZE_ROUTING,
    "npu::npu_prefetch": PREFETCH,
    "atb::npu_ring_mla": RING_MLA,
    "atb::npu_ring_mla.out": RING_MLA,
    "atb::npu_paged_cache_load": PAGED_CACHE_LOAD,
    "atb::npu_paged_cache_load.out": PAGED_CACHE_LOAD,
}


def check(op: str, args: Args) -> None:
    """LimitRefused for the first documented limit of ``op`` that ``args`` (bound by the schema's names) break."""
    for limit in LIMITS.get(op, ()):
        refusal = limit.refusal(op, args)
        if refusal is not None:
            raise LimitRefused(refusal)
