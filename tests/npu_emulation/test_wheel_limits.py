"""The rollout kernels' documented limits (wheel_contract/limits.py): every limit quotes the wheel's documentation
verbatim, refuses an input just outside it with a message naming the op, the argument and the quote, and accepts
one just inside; the two CPU-proof exceptions relax exactly what they declare (float32 where bf16/fp16 are listed,
the scaled-down model's sizes) and the fp32 patch is what switches them on; the ops apply the limits."""

from __future__ import annotations

import re
import zipfile
from types import SimpleNamespace

import pytest
import torch

from verl_patches.npu_emulation.ops.inference_registry import register_inference_ops
from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops
from verl_patches.npu_emulation.wheel_contract import limits
from verl_patches.npu_emulation.wheel_contract.cpu_proof import EXCEPTIONS, FP32_RUN, SCALED_MODEL, in_effect
from verl_patches.npu_emulation.wheel_contract.fetch import verified_wheel

BF16, F32, F64, I32, I64, I8 = torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.int8


def T(*shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype)


@pytest.fixture(autouse=True)
def _as_on_a3(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither CPU-proof exception in effect: the limits as the real kernels apply them."""
    for exception in EXCEPTIONS:
        monkeypatch.delenv(exception.env, raising=False)


# ---- a base call that every limit of the op accepts, and per limit one input just inside, one just outside --------
def fia_base() -> dict:
    """FIA as vllm-ascend's MLA decode calls it at DeepSeek-V3's sizes on A3 (TP2: 64 heads per rank)."""
    return dict(
        query=T(2, 64, 1, 512),
        key=T(4, 1, 128, 512),
        value=T(4, 1, 128, 512),
        query_rope=T(2, 64, 1, 64),
        key_rope=T(4, 1, 128, 64),
        input_layout="BNSD",
        num_heads=64,
        num_key_value_heads=1,
        sparse_mode=0,
        atten_mask=None,
        block_table=T(2, 4, dtype=I32),
        block_size=128,
        actual_seq_lengths_kv=[5, 3],
    )


NO_ROPE = dict(query_rope=None, key_rope=None)
FIA_CASES = [  # (inside, outside), in the order of limits.FIA
    (dict(query=T(2, 64, 1, 512, dtype=I8)), dict(query=T(2, 64, 1, 512, dtype=F64))),
    (dict(key=T(4, 1, 128, 512, dtype=I32)), dict(key=T(4, 1, 128, 512, dtype=F64))),
    (dict(value=T(4, 1, 128, 512, dtype=torch.float16)), dict(value=T(4, 1, 128, 512, dtype=F64))),
    (dict(query_rope=T(2, 64, 1, 64, dtype=torch.float16)), dict(query_rope=T(2, 64, 1, 64, dtype=I8))),
    (dict(key_rope=T(4, 1, 128, 64)), dict(key_rope=T(4, 1, 128, 64, dtype=F64))),
    (dict(input_layout="TND"), dict(input_layout="SBH")),
    (dict(NO_ROPE, num_heads=128, num_key_value_heads=2), dict(NO_ROPE, num_heads=130, num_key_value_heads=2)),
    (dict(sparse_mode=4), dict(sparse_mode=5)),
    (dict(NO_ROPE), dict(key_rope=None)),
    (dict(num_heads=32), dict(num_heads=16)),
    (dict(query=T(2, 64, 1, 512)), dict(query=T(2, 64, 1, 256))),
    (dict(query_rope=T(2, 64, 1, 64)), dict(query_rope=T(2, 64, 1, 32))),
    (dict(query=T(2, 64, 16, 512), sparse_mode=3, atten_mask=T(1)), dict(query=T(2, 64, 17, 512))),
    (dict(num_key_value_heads=1), dict(num_key_value_heads=2)),
    (dict(key=T(4, 1, 128, 512)), dict(key=T(4, 1, 128, 256))),
    (dict(block_table=T(2, 4, dtype=I32)), dict(block_table=None)),
    (dict(block_size=16), dict(block_size=64)),
    (dict(sparse_mode=0, atten_mask=None), dict(sparse_mode=3, atten_mask=T(1))),
    (dict(actual_seq_lengths_kv=[1, 1]), dict(actual_seq_lengths_kv=None)),
    (dict(block_table=T(2, 1, dtype=I32)), dict(block_table=T(8, dtype=I32))),
]

TOP_K_BASE = dict(logits=T(2, 2000, dtype=F32), p=T(2, dtype=F32) + 0.5, k=torch.tensor([1, 1024], dtype=I32))
TOP_K_CASES = [
    (dict(logits=T(2, 2000, dtype=F32)), dict(logits=T(2000, dtype=F32))),
    (dict(logits=T(2, 2000, dtype=BF16), p=T(2) + 0.5), dict(logits=T(2, 2000, dtype=F64))),
    (dict(p=T(2, dtype=F32)), dict(p=T(2, dtype=torch.float16))),
    (dict(p=T(2, dtype=F32)), dict(p=T(3, dtype=F32))),
    (dict(p=torch.tensor([0.0, 1.0])), dict(p=torch.tensor([0.5, 1.5]))),
    (dict(k=torch.tensor([1, 2], dtype=I32)), dict(k=torch.tensor([1, 2], dtype=I64))),
    (dict(k=torch.tensor([1, 2], dtype=I32)), dict(k=torch.tensor([[1], [2]], dtype=I32))),
    (dict(k=torch.tensor([1, 1024], dtype=I32)), dict(k=torch.tensor([1, 1025], dtype=I32))),
    (
        dict(logits=T(2, 10, dtype=F32), k=torch.tensor([10, 1], dtype=I32)),
        dict(logits=T(2, 10, dtype=F32), k=torch.tensor([11, 1], dtype=I32)),
    ),  # fmt: skip
]

GMM_BASE = dict(
    x=[T(4, 3, dtype=F32)],
    weight=[T(2, 3, 5, dtype=F32)],
    split_item=3,
    group_type=0,
    group_list=torch.tensor([1, 4]),
    group_list_type=0,
    act_type=0,
)
GMM_CASES = [
    (dict(x=[T(1, 3, dtype=F32)] * 128, split_item=0), dict(x=[T(1, 3, dtype=F32)] * 129)),
    (dict(weight=[T(3, 5, dtype=F32)] * 128), dict(weight=[T(3, 5, dtype=F32)] * 129)),
    (dict(x=[T(4, 3, dtype=I8)]), dict(x=[T(4, 3, dtype=F64)])),
    (dict(weight=[T(3, 5, dtype=F32)]), dict(weight=[T(5, dtype=F32)])),
    (dict(split_item=0), dict(split_item=4)),
    (dict(split_item=0, x=[T(1, 1, 1, 1, 4, 3, dtype=F32)]), dict(x=[T(1, 4, 3, dtype=F32)])),
    (dict(group_type=-1), dict(group_type=1)),
    (dict(group_list_type=1), dict(group_list_type=2)),
    (dict(group_list=torch.tensor([1, 4])), dict(group_list=torch.tensor([1, 4], dtype=I32))),
    (dict(group_list=torch.tensor([1, 1])), dict(group_list=torch.tensor([3, 1]))),
    (dict(act_type=5), dict(act_type=6)),
]

GATING_BASE = dict(x=T(3, 8, dtype=F32), k=2)
GATING_CASES = [
    (dict(x=T(1, 3, 8, dtype=F32)), dict(x=T(8, dtype=F32))),
    (dict(x=T(3, 8, dtype=BF16)), dict(x=T(3, 8, dtype=F64))),
    (dict(x=T(3, 2000, dtype=F32), k=1024), dict(x=T(3, 2000, dtype=F32), k=1025)),
]
INIT_BASE = dict(x=T(3, 4, dtype=F32), row_idx=T(3, 2, dtype=I32), expert_idx=T(3, 2, dtype=I32))
INIT_CASES = [
    (dict(x=T(3, 4, dtype=F32)), dict(x=T(1, 3, 4, dtype=F32))),
    (dict(x=T(3, 4, dtype=torch.float16)), dict(x=T(3, 4, dtype=F64))),
    (dict(row_idx=T(3, 2, dtype=I32)), dict(row_idx=T(3, 2, dtype=I64))),
    (dict(expert_idx=T(3, 2, dtype=I32)), dict(expert_idx=T(3, 2, dtype=I64))),
]
TOKENS_BASE = dict(sorted_expert_for_source_row=T(6, dtype=I32))
TOKENS_CASES = [
    (dict(sorted_expert_for_source_row=T(6, dtype=I32)), dict(sorted_expert_for_source_row=T(2, 3, dtype=I32))),
    (dict(sorted_expert_for_source_row=T(6, dtype=I32)), dict(sorted_expert_for_source_row=T(6, dtype=I64))),
]
FINALIZE_BASE = dict(
    expanded_permuted_rows=T(6, 4, dtype=F32), expanded_src_to_dst_row=T(6, dtype=I32), drop_pad_mode=0
)
FINALIZE_CASES = [
    (dict(expanded_permuted_rows=T(6, 4)), dict(expanded_permuted_rows=T(6, 4, dtype=F64))),
    (dict(expanded_src_to_dst_row=T(6, dtype=I32)), dict(expanded_src_to_dst_row=T(6, dtype=I64))),
    (dict(drop_pad_mode=0), dict(drop_pad_mode=1)),
]
PREFETCH_BASE = dict(max_size=64, offset=0)
PREFETCH_CASES = [(dict(max_size=1), dict(max_size=0)), (dict(offset=0), dict(offset=-1))]


def ring_base() -> dict:
    """npu_ring_mla as vllm-ascend's MLA prefill calls it at DeepSeek-V3's sizes."""
    return dict(
        q_nope=T(5, 64, 128),
        q_rope=T(5, 64, 64),
        k_nope=T(5, 64, 128),
        k_rope=T(5, 64, 64),
        value=T(5, 64, 128),
        mask=T(512, 512),
        seqlen=torch.tensor([2, 3], dtype=I32),
        input_layout="type_bsnd",
        mask_type="mask_type_triu",
        calc_type="calc_type_first_ring",
        kernel_type="kernel_type_high_precision",
    )


RING_CASES = [
    (dict(q_nope=T(5, 64, 128, dtype=torch.float16)), dict(q_nope=T(5, 64, 128, dtype=F64))),
    (dict(q_rope=T(5, 64, 64)), dict(q_rope=T(5, 64, 64, dtype=F64))),
    (dict(k_nope=T(5, 64, 128)), dict(k_nope=T(5, 64, 128, dtype=F64))),
    (dict(k_rope=T(5, 64, 64)), dict(k_rope=T(5, 64, 64, dtype=F64))),
    (dict(value=T(5, 64, 128)), dict(value=T(5, 64, 128, dtype=F64))),
    (dict(q_nope=T(5, 64, 128)), dict(q_nope=T(5, 64, 192))),
    (dict(q_rope=T(5, 64, 64)), dict(q_rope=T(5, 64, 32))),
    (dict(input_layout=None), dict(input_layout="type_bnsd")),
    (dict(mask_type="no_mask"), dict(mask_type="triu")),
    (dict(calc_type="calc_type_default"), dict(calc_type="calc_type_last_ring")),
    (dict(kernel_type="kernel_type_default"), dict(kernel_type="kernel_type_fast")),
    (dict(seqlen=torch.tensor([[2, 2], [2, 0]], dtype=I32)), dict(seqlen=torch.tensor([[3, 2], [2, 2]], dtype=I32))),
]
PCL_BASE = dict(
    key_cache=T(8, 128, 1, 512),
    value_cache=T(8, 128, 1, 64),
    block_table=T(2, 4, dtype=I32),
    context_lens=T(2, dtype=I32),
    seq_starts=T(2, dtype=I32),
)
PCL_CASES = [
    (dict(key_cache=T(8, 128, 1, 512, dtype=I8)), dict(key_cache=T(8, 128, 1, 512, dtype=F64))),
    (dict(value_cache=T(8, 128, 1, 64, dtype=torch.float16)), dict(value_cache=T(8, 128, 1, 64, dtype=F64))),
    (dict(block_table=T(2, 4, dtype=I32)), dict(block_table=T(2, 4, dtype=I64))),
    (dict(context_lens=T(2, dtype=I32)), dict(context_lens=T(2, dtype=I64))),
    (dict(seq_starts=None), dict(seq_starts=T(2, dtype=I64))),
    (dict(key_cache=T(8, 128, 1, 16)), dict(key_cache=T(8, 128, 1, 8))),  # 32 bytes of bf16 rows, then 16
    (dict(value_cache=T(8, 128, 2, 8)), dict(value_cache=T(8, 128, 1, 8))),
]

TABLE = {
    "npu::npu_fused_infer_attention_score": (fia_base, FIA_CASES),
    "npu::npu_top_k_top_p": (lambda: dict(TOP_K_BASE), TOP_K_CASES),
    "npu::npu_grouped_matmul": (lambda: dict(GMM_BASE), GMM_CASES),
    "npu::npu_moe_gating_top_k_softmax": (lambda: dict(GATING_BASE), GATING_CASES),
    "npu::npu_moe_init_routing": (lambda: dict(INIT_BASE), INIT_CASES),
    "npu::npu_moe_compute_expert_tokens": (lambda: dict(TOKENS_BASE), TOKENS_CASES),
    "npu::npu_moe_finalize_routing": (lambda: dict(FINALIZE_BASE), FINALIZE_CASES),
    "npu::npu_prefetch": (lambda: dict(PREFETCH_BASE), PREFETCH_CASES),
    "atb::npu_ring_mla": (ring_base, RING_CASES),
    "atb::npu_paged_cache_load": (lambda: dict(PCL_BASE), PCL_CASES),
}


def all_cases():
    for op, (base, cases) in TABLE.items():
        for i, (inside, outside) in enumerate(cases):
            yield pytest.param(op, i, base, inside, outside, id=f"{op.split('::')[1]}[{i}]")


def test_every_limit_has_a_case_and_every_op_with_limits_a_table():
    assert {op.split(".")[0] for op in limits.LIMITS} == set(TABLE)
    for op, (_, cases) in TABLE.items():
        assert len(cases) == len(limits.LIMITS[op]), op
    assert limits.LIMITS["atb::npu_ring_mla.out"] is limits.LIMITS["atb::npu_ring_mla"]
    assert limits.LIMITS["atb::npu_paged_cache_load.out"] is limits.LIMITS["atb::npu_paged_cache_load"]


@pytest.mark.parametrize(("op", "index", "base", "inside", "outside"), list(all_cases()))
def test_each_limit_refuses_just_outside_and_accepts_just_inside(op, index, base, inside, outside):
    limit = limits.LIMITS[op][index]
    assert limit.refusal(op, base()) is None, "the base call is inside every limit"
    assert limit.refusal(op, {**base(), **inside}) is None
    message = limit.refusal(op, {**base(), **outside})
    assert message is not None
    assert message.startswith(f"{op}: {limit.arg} ") and f'"{limit.quote}"' in message
    assert f"the real kernel requires {limit.requirement}" in message and limit.doc in message


def test_the_base_calls_pass_the_whole_check():
    for op, (base, _) in TABLE.items():
        limits.check(op, base())


def _doc_sections() -> dict[str, str]:
    with zipfile.ZipFile(verified_wheel()) as z:
        return {doc: z.read(doc).decode("utf-8") for doc in (limits.OPS_DOC, limits.ATB_DOC)}


def test_every_quote_is_the_wheels_own_words_in_the_ops_section():
    docs = _doc_sections()
    for op, rows in limits.LIMITS.items():
        name = op.split("::")[1].split(".")[0]
        for limit in rows:
            match = re.search(rf'"{re.escape(name)}",\s*"""(.*?)"""', docs[limit.doc], re.DOTALL)
            assert match, f"{limit.doc} has no section for {name}"
            assert limit.quote in match.group(1), (op, limit.arg, limit.quote)


# ---- the two declared exceptions ----------------------------------------------------------------------------------
def test_float32_is_accepted_only_while_the_fp32_run_is_declared_and_nothing_else_is(monkeypatch):
    op, fia = "npu::npu_fused_infer_attention_score", fia_base()
    fp32 = {**fia, "query": T(2, 64, 1, 512, dtype=F32), "query_rope": T(2, 64, 1, 64, dtype=F32)}
    refusal = "query is a torch.float32 tensor .* dtype float16, bfloat16, int8.* only while the CPU proof's fp32 run"
    with pytest.raises(limits.LimitRefused, match=refusal):
        limits.check(op, fp32)
    monkeypatch.setenv(FP32_RUN.env, "1")
    assert in_effect(FP32_RUN) and not in_effect(SCALED_MODEL)
    limits.check(op, fp32)
    with pytest.raises(limits.LimitRefused, match="query is a torch.float64 tensor"):
        limits.check(op, {**fia, "query": T(2, 64, 1, 512, dtype=F64)})  # outside the list and not float32
    with pytest.raises(limits.LimitRefused, match="num_heads is 2"):
        limits.check(op, {**fp32, "num_heads": 2})  # a size is not a dtype
    with pytest.raises(limits.LimitRefused, match="k is a torch.int64"):  # int32 only: nothing relaxes it
        limits.check("npu::npu_top_k_top_p", {**TOP_K_BASE, "k": torch.tensor([1, 2])})


def test_the_scaled_down_model_relaxes_sizes_only(monkeypatch):
    op = "npu::npu_fused_infer_attention_score"
    tiny = {
        **fia_base(),
        "query": T(2, 2, 1, 16),
        "key": T(4, 1, 128, 16),
        "value": T(4, 1, 128, 16),
        "query_rope": T(2, 2, 1, 8),
        "key_rope": T(4, 1, 128, 8),
        "num_heads": 2,
    }
    with pytest.raises(
        limits.LimitRefused, match=r"num_heads is 2: the real kernel requires 32, 64 or 128 query heads"
    ):
        limits.check(op, tiny)
    monkeypatch.setenv(SCALED_MODEL.env, "1")
    limits.check(op, tiny)
    with pytest.raises(limits.LimitRefused, match="block_size is 4"):
        limits.check(op, {**tiny, "block_size": 4})  # not a model size
    with pytest.raises(limits.LimitRefused, match="query is a torch.float32"):
        limits.check(op, {**tiny, "query": T(2, 2, 1, 16, dtype=F32)})


def test_the_fp32_patch_declares_both_exceptions_when_it_lets_float32_through():
    from verl_patches.patches.vllm.engine.fp32_on_cpu import wrap_v1_oracle

    oracle = wrap_v1_oracle(lambda self, model_config: str(model_config.dtype))
    assert oracle(None, SimpleNamespace(dtype=torch.bfloat16)) == "torch.bfloat16"
    assert not in_effect(FP32_RUN) and not in_effect(SCALED_MODEL)
    assert oracle(None, SimpleNamespace(dtype=torch.float32)) == "torch.bfloat16"  # shown as bf16, as before
    assert in_effect(FP32_RUN) and in_effect(SCALED_MODEL)


# ---- the ops apply them --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ops():
    register_inference_ops()
    register_moe_ops()
    return torch.ops.npu, torch.ops.atb


def test_top_k_above_1024_is_refused_by_the_op_and_1024_runs(ops, torch_npu):
    logits = torch.randn(2, 1100)
    p = torch.tensor([0.9, 1.0])
    with pytest.raises(
        limits.LimitRefused, match=r'npu::npu_top_k_top_p: k .* values in \[1, 1024\].*"表示top-k的阈值'
    ):
        torch_npu.npu_top_k_top_p(logits, p, torch.tensor([1025, 3], dtype=I32))
    out = torch_npu.npu_top_k_top_p(logits, p, torch.tensor([1024, 3], dtype=I32))
    assert torch.isfinite(out[1]).sum() == 3


def test_the_mla_decode_at_tiny_sizes_runs_only_under_the_cpu_proofs_exceptions(ops, monkeypatch):
    npu, _ = ops
    fia = dict(
        num_heads=2,
        num_key_value_heads=1,
        input_layout="BNSD",
        block_table=torch.tensor([[0], [1]], dtype=I32),
        block_size=16,
        actual_seq_lengths_kv=[3, 2],
    )
    args = (T(2, 2, 1, 16, dtype=F32), T(2, 1, 16, 16, dtype=F32), T(2, 1, 16, 16, dtype=F32))
    ropes = dict(query_rope=T(2, 2, 1, 8, dtype=F32), key_rope=T(2, 1, 16, 8, dtype=F32))
    with pytest.raises(limits.LimitRefused, match="query is a torch.float32"):
        npu.npu_fused_infer_attention_score(*args, **ropes, **fia)
    monkeypatch.setenv(FP32_RUN.env, "1")
    with pytest.raises(limits.LimitRefused, match="num_heads is 2"):
        npu.npu_fused_infer_attention_score(*args, **ropes, **fia)
    monkeypatch.setenv(SCALED_MODEL.env, "1")
    out, lse = npu.npu_fused_infer_attention_score(*args, **ropes, **fia)
    assert out.shape == (2, 2, 1, 16) and lse.shape == (1,)


def test_the_mla_decode_at_a3_sizes_runs_without_any_exception(ops):
    npu, _ = ops
    q, cache = torch.randn(1, 32, 1, 512).bfloat16(), torch.randn(2, 1, 128, 512).bfloat16()
    out, _ = npu.npu_fused_infer_attention_score(
        q,
        cache,
        cache,
        query_rope=torch.randn(1, 32, 1, 64).bfloat16(),
        key_rope=torch.randn(2, 1, 128, 64).bfloat16(),
        num_heads=32,
        num_key_value_heads=1,
        input_layout="BNSD",
        block_table=torch.tensor([[1]], dtype=I32),
        block_size=128,
        actual_seq_lengths_kv=[100],
        scale=0.05,
    )
    assert out.shape == (1, 32, 1, 512) and out.dtype == BF16 and torch.isfinite(out.float()).all()


def test_the_atb_and_moe_ops_apply_their_limits(ops):
    npu, atb = ops
    with pytest.raises(limits.LimitRefused, match="atb::npu_paged_cache_load: context_lens is a torch.int64"):
        atb.npu_paged_cache_load(T(2, 16, 1, 16), T(2, 16, 1, 16), T(1, 2, dtype=I32), torch.tensor([3]))
    with pytest.raises(limits.LimitRefused, match="atb::npu_ring_mla: q_nope is a torch.float32"):
        atb.npu_ring_mla(
            *(T(2, 1, 4, dtype=F32),) * 5, T(512, 512, dtype=F32), torch.tensor([2], dtype=I32), 1, 1
        )  # fmt: skip
    with pytest.raises(limits.LimitRefused, match="npu::npu_grouped_matmul: group_type is 1"):
        x, w = [T(4, 3, dtype=F32)], [T(1, 3, 2, dtype=F32)]
        npu.npu_grouped_matmul(x, w, group_list=torch.tensor([4]), split_item=3, group_type=1)
    with pytest.raises(limits.LimitRefused, match="npu::npu_prefetch: max_size is 0"):
        npu.npu_prefetch(T(4), None, 0)
