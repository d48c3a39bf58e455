"""The MoE inference ops vllm-ascend's fused MoE layer calls (gating, init/finalize routing, expert tokens, list-form
grouped matmul), called as the registered ``torch.ops.npu`` custom ops with vllm-ascend's keyword arguments, each
against an independent per-token reference; the EP1 chain of vllm-ascend's `fused_experts` against
out[t] = sum_k w[t, k] * expert_{e[t, k]}(x[t]); DeepSeek-V3's 256-expert gating; the ops under
``torch.compile(fullgraph=True)``; bad inputs."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.npu_emulation.moe_reference import (
    distinct_choices,
    fused_experts_ep1,
    gen,
    moe_reference,
    tiny_moe,
    vllm_row_idx,
)
from verl_patches.npu_emulation import hccl_names
from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

REPO = Path(__file__).resolve().parents[2]
OPS = register_moe_ops()
npu = torch.ops.npu
F32 = torch.float32


# ---- gating -----------------------------------------------------------------------------------------------------
def gating_reference(logits, k, bias, k_group, group_count, mode, norm_type, scale, eps=1e-20):
    """Per token, in Python floats: scores, the groups, the experts, the weights."""
    ids, weights = [], []
    experts = logits.shape[1]
    per_group = experts // group_count
    for row in logits.double().tolist():
        if norm_type == 1:
            s = [1 / (1 + math.exp(-v)) for v in row]
        else:
            z = sum(math.exp(v) for v in row)
            s = [math.exp(v) / z for v in row]
        c = [s[i] + (float(bias[i]) if bias is not None else 0.0) for i in range(experts)]
        score = []
        for grp in range(group_count):
            vals = sorted(c[grp * per_group : (grp + 1) * per_group], reverse=True)
            score.append(vals[0] if mode == 0 else vals[0] + vals[1])
        groups = sorted(range(group_count), key=lambda grp: (-score[grp], grp))[:k_group]
        allowed = [i for i in range(experts) if i // per_group in groups]
        chosen = sorted(allowed, key=lambda i: (-c[i], i))[:k]
        w = [s[i] for i in chosen]
        if norm_type == 1:
            total = sum(w) + eps
            w = [v / total for v in w]
        ids.append(chosen)
        weights.append([v * scale for v in w])
    return torch.tensor(ids, dtype=torch.int32), torch.tensor(weights, dtype=torch.float64)


def test_deepseek_v3_gating_at_256_experts_matches_per_token_reference():
    logits = torch.randn(6, 256, generator=gen(1))
    bias = torch.randn(256, generator=gen(2)) * 0.1
    # as vllm-ascend calls it for DeepSeek-V3 (256 experts): top 8 of 4 groups out of 8, sigmoid, no scaling
    y, ids, norm = OPS["npu_moe_gating_top_k"](
        logits,
        k=8,
        bias=bias,
        k_group=4,
        group_count=8,
        group_select_mode=1,
        renorm=0,
        norm_type=1,
        routed_scaling_factor=1,
        eps=1e-20,
    )
    ref_ids, ref_w = gating_reference(logits, 8, bias, 4, 8, 1, 1, 1.0)
    assert ids.dtype == torch.int32 and torch.equal(ids, ref_ids)
    torch.testing.assert_close(y.double(), ref_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(norm, torch.sigmoid(logits))
    # the chosen experts lie in 4 groups, and the bias changed the choice for some token
    assert all(len({int(e) // 32 for e in row}) <= 4 for row in ids)
    plain, _ = gating_reference(logits, 8, None, 4, 8, 1, 1, 1.0)
    assert not torch.equal(plain, ref_ids)


@pytest.mark.parametrize("mode,norm_type,scale", [(0, 1, 2.5), (1, 1, 1.0), (0, 0, 1.0)])
def test_gating_top_k_group_modes_and_softmax(mode, norm_type, scale):
    logits = torch.randn(5, 16, generator=gen(3))
    bias = torch.randn(16, generator=gen(4)) * 0.2
    y, ids, _ = npu.npu_moe_gating_top_k(
        logits, 3, bias=bias, k_group=2, group_count=4, group_select_mode=mode, norm_type=norm_type,
        routed_scaling_factor=scale,
    )  # fmt: skip
    ref_ids, ref_w = gating_reference(logits, 3, bias, 2, 4, mode, norm_type, scale)
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(y.double(), ref_w, rtol=1e-5, atol=1e-6)


def test_gating_top_k_keeps_bf16_and_ungrouped():
    logits = torch.randn(4, 8, generator=gen(5)).bfloat16()
    y, ids, norm = npu.npu_moe_gating_top_k(logits, 2, norm_type=1)
    ref_ids, ref_w = gating_reference(logits.float(), 2, None, 1, 1, 0, 1, 1.0)
    assert y.dtype == torch.bfloat16 and norm.dtype == F32
    assert torch.equal(ids, ref_ids)
    torch.testing.assert_close(y.double(), ref_w, rtol=1e-2, atol=1e-2)


def test_gating_top_k_softmax_and_row_idx():
    logits = torch.randn(5, 6, generator=gen(6))
    y, ids, row_idx = npu.npu_moe_gating_top_k_softmax(x=logits, finished=None, k=2)
    probs = torch.softmax(logits.double(), dim=-1)
    for t in range(5):
        order = sorted(range(6), key=lambda i: (-float(probs[t, i]), i))[:2]
        assert ids[t].tolist() == order
        torch.testing.assert_close(y[t].double(), probs[t, order], rtol=1e-5, atol=1e-6)
        assert row_idx[t].tolist() == [0 * 5 + t, 1 * 5 + t]


# ---- init routing, expert tokens, finalize ----------------------------------------------------------------------
def test_init_routing_sorts_slots_by_expert_and_maps_them_back():
    tokens, hidden, k, experts = 7, 4, 3, 5
    x = torch.randn(tokens, hidden, generator=gen(7))
    ids = distinct_choices(tokens, experts, k, seed=8)
    expanded_x, expanded_row_idx, expanded_expert_idx = npu.npu_moe_init_routing(
        x, row_idx=vllm_row_idx(tokens, k), expert_idx=ids, active_num=tokens
    )
    assert expanded_x.shape == (tokens * k, hidden)
    assert expanded_row_idx.dtype == expanded_expert_idx.dtype == torch.int32
    # the experts come sorted, and ties keep token order
    assert expanded_expert_idx.tolist() == sorted(ids.reshape(-1).tolist())
    seen = {}
    for t in range(tokens):
        for j in range(k):
            row = int(expanded_row_idx[j * tokens + t])
            torch.testing.assert_close(expanded_x[row], x[t])
            assert int(expanded_expert_idx[row]) == int(ids[t, j])
            seen.setdefault(int(ids[t, j]), []).append((row, t))
    for rows in seen.values():
        assert [t for _, t in sorted(rows)] == sorted(t for _, t in rows)


def test_init_routing_worked_example_and_active_num():
    x = torch.tensor([[0.1] * 4, [0.2] * 4, [0.3] * 4])
    row_idx = torch.tensor([[0, 3], [1, 4], [2, 5]], dtype=torch.int32)
    ids = torch.tensor([[1, 2], [0, 1], [0, 2]], dtype=torch.int32)
    ex, er, ee = npu.npu_moe_init_routing(x, row_idx, ids, 3)
    # slots by expert: e0 <- tokens 1, 2; e1 <- tokens 0, 1; e2 <- tokens 0, 2
    assert ee.tolist() == [0, 0, 1, 1, 2, 2]
    torch.testing.assert_close(ex[:, 0], torch.tensor([0.2, 0.3, 0.1, 0.2, 0.1, 0.3]))
    assert er.tolist() == [2, 0, 1, 4, 3, 5]
    ex2, er2, _ = npu.npu_moe_init_routing(x, row_idx, ids, 1)
    assert ex2.shape == (2, 4) and torch.equal(er2, er)  # only min(active_num, T) * K rows are expanded


def test_compute_expert_tokens_is_cumulative_count():
    sorted_ids = torch.tensor([0, 0, 2, 2, 2, 3, 5], dtype=torch.int32)
    out = npu.npu_moe_compute_expert_tokens(sorted_ids, 7)
    ref = [sum(1 for v in sorted_ids.tolist() if v <= e) for e in range(7)]
    assert out.dtype == torch.int32 and out.tolist() == ref


def test_finalize_routing_weighted_sum_with_skips_and_bias():
    tokens, k, hidden, experts = 4, 2, 3, 5
    rows = torch.randn(tokens * k, hidden, generator=gen(9))
    where = torch.randperm(tokens * k, generator=gen(10)).to(torch.int32)
    ids = distinct_choices(tokens, experts, k, seed=11)
    scales = torch.rand(tokens, k, generator=gen(12))
    skip1, skip2 = torch.randn(tokens, hidden, generator=gen(13)), torch.randn(tokens, hidden, generator=gen(14))
    bias = torch.randn(experts, hidden, generator=gen(15))
    out = npu.npu_moe_finalize_routing(
        rows, skip1=skip1, skip2=skip2, bias=bias, scales=scales, expanded_src_to_dst_row=where,
        export_for_source_row=ids,
    )  # fmt: skip
    for t in range(tokens):
        ref = skip1[t] + skip2[t]
        for j in range(k):
            ref = ref + scales[t, j] * (rows[int(where[j * tokens + t])] + bias[int(ids[t, j])])
        torch.testing.assert_close(out[t], ref)
    plain = npu.npu_moe_finalize_routing(rows, None, None, None, scales, where, ids)
    for t in range(tokens):
        torch.testing.assert_close(plain[t], sum(scales[t, j] * rows[int(where[j * tokens + t])] for j in range(k)))


def test_finalize_routing_sums_bf16_in_fp32():
    rows = torch.randn(6, 8, generator=gen(16)).bfloat16()
    where = torch.arange(6, dtype=torch.int32)
    scales = torch.rand(3, 2, generator=gen(17)).bfloat16()
    out = npu.npu_moe_finalize_routing(rows, None, None, None, scales, where, None)
    ref = (rows.float().view(2, 3, 8) * scales.float().t().unsqueeze(-1)).sum(0).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref)


def test_re_routing_regroups_rank_major_blocks_by_expert():
    counts = torch.tensor([[2, 0, 1], [1, 3, 1]], dtype=torch.int32)  # [rank, expert]
    tokens = torch.arange(8, dtype=F32).unsqueeze(1).repeat(1, 2)
    scales = torch.arange(8, dtype=F32) / 10
    out, out_scales, idx, per_expert = npu.npu_moe_re_routing(tokens, counts, per_token_scales=scales)
    # source rows: rank 0 -> [0,1 | - | 2], rank 1 -> [3 | 4,5,6 | 7]; expert-major: e0 r0, e0 r1, e1 r0, ...
    assert idx.tolist() == [0, 1, 3, 4, 5, 6, 2, 7]
    torch.testing.assert_close(out[:, 0], torch.tensor([0, 1, 3, 4, 5, 6, 2, 7], dtype=F32))
    torch.testing.assert_close(out_scales, scales[idx.long()])
    assert per_expert.tolist() == [3, 3, 2] and per_expert.dtype == torch.int32


# ---- grouped matmul ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_groups_rows_by_expert(group_list_type):
    sizes = [2, 0, 3]
    x = torch.randn(7, 4, generator=gen(18))  # 5 grouped rows, 2 rows after the last group
    w = torch.randn(3, 6, 4, generator=gen(19)).transpose(1, 2)  # [E, K, N] view, as vllm-ascend passes w1
    group_list = torch.tensor(sizes if group_list_type else [2, 2, 5], dtype=torch.int64)
    (y,) = npu.npu_grouped_matmul(
        x=[x], weight=[w], split_item=2, group_list_type=group_list_type, group_type=0, group_list=group_list
    )
    starts = [0, 2, 2]
    for e, (lo, n) in enumerate(zip(starts, sizes)):
        for r in range(lo, lo + n):
            torch.testing.assert_close(y[r], x[r] @ w[e])
    assert torch.equal(y[5:], torch.zeros(2, 6))


def test_grouped_matmul_weight_list_bias_dtype_and_ungrouped():
    x = torch.randn(4, 3, generator=gen(20))
    ws = [torch.randn(3, 2, generator=gen(21 + i)) for i in range(2)]
    bias = torch.randn(2, 2, generator=gen(23))
    (y,) = npu.npu_grouped_matmul(
        [x],
        ws,
        bias=[bias],
        group_list=torch.tensor([1, 3]),
        split_item=3,
        group_type=0,
        group_list_type=1,
        output_dtype=torch.float64,
    )
    assert y.dtype == torch.float64
    torch.testing.assert_close(y[0], (x[0] @ ws[0] + bias[0]).double())
    torch.testing.assert_close(y[1:], (x[1:] @ ws[1] + bias[1]).double())
    xs = [torch.randn(2, 3, generator=gen(24)), torch.randn(5, 3, generator=gen(25))]
    ys = npu.npu_grouped_matmul(xs, ws, split_item=0, group_type=-1)  # the wheel's Meta takes -1 or 0, not None
    assert [tuple(t.shape) for t in ys] == [(2, 2), (5, 2)]
    torch.testing.assert_close(ys[1], xs[1] @ ws[1])
    (cat,) = npu.npu_grouped_matmul(xs, ws, split_item=2, group_type=-1)
    torch.testing.assert_close(cat, torch.cat([xs[0] @ ws[0], xs[1] @ ws[1]]))


# ---- the EP1 chain of vllm-ascend's fused_experts ---------------------------------------------------------------
def test_fused_experts_ep1_chain_matches_per_token_reference():
    x, w13, w2, weights, ids = tiny_moe()
    out = fused_experts_ep1(x, w13, w2, weights, ids)
    torch.testing.assert_close(out.double(), moe_reference(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


def test_deepseek_v3_shapes_gating_then_experts():
    """256 experts, top 8 of 4 groups out of 8: the whole routed-expert path against the reference."""
    x, w13, w2, _, _ = tiny_moe(tokens=5, hidden=8, inter=4, experts=256, k=8, seed=40)
    logits, bias = torch.randn(5, 256, generator=gen(45)), torch.randn(256, generator=gen(46)) * 0.1
    weights, ids, _ = npu.npu_moe_gating_top_k(
        logits, k=8, bias=bias, k_group=4, group_count=8, group_select_mode=1, norm_type=1
    )
    out = fused_experts_ep1(x, w13, w2, weights, ids)
    torch.testing.assert_close(out.double(), moe_reference(x, w13, w2, weights, ids), rtol=1e-5, atol=1e-5)


def test_ops_trace_under_fullgraph_compile():
    x, w13, w2, _, _ = tiny_moe(experts=16, k=4, seed=50)
    logits, bias = torch.randn(6, 16, generator=gen(55)), torch.randn(16, generator=gen(56)) * 0.1

    def layer(x, logits, bias):
        weights, ids, _ = torch.ops.npu.npu_moe_gating_top_k(
            logits, k=4, bias=bias, k_group=2, group_count=4, group_select_mode=1, norm_type=1
        )
        return fused_experts_ep1(x, w13, w2, weights.to(x.dtype), ids) * 2.5

    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, logits, bias), layer(x, logits, bias))
    torch._dynamo.reset()


def test_fake_kernels_give_the_shapes_without_values():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(5, 16)
        ids = torch.empty(5, 2, dtype=torch.int32)
        ex, er, ee = npu.npu_moe_init_routing(x, vllm_row_idx(5, 2), ids, 5)
        (y,) = npu.npu_grouped_matmul([ex], [torch.empty(8, 16, 32)], split_item=2, group_type=0,
                                      group_list=torch.empty(8, dtype=torch.int64))  # fmt: skip
        out = npu.npu_moe_finalize_routing(y[:, :16], None, None, None, torch.empty(5, 2), er, ids)
    assert (ex.shape, er.shape, ee.shape, y.shape, out.shape) == ((10, 16), (10,), (10,), (10, 32), (5, 16))


# ---- bad inputs -------------------------------------------------------------------------------------------------
def test_bad_inputs_are_named():
    x = torch.randn(3, 4)
    ids = torch.tensor([[0, 1], [1, 2], [2, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="expert_idx is a torch.int64 tensor .* requires dtype int32"):
        npu.npu_moe_init_routing(x, vllm_row_idx(3, 2), ids.long(), 3)
    with pytest.raises(ValueError, match="row_idx must hold each of 0..5 once"):
        npu.npu_moe_init_routing(x, torch.zeros(3, 2, dtype=torch.int32), ids, 3)
    with pytest.raises(TypeError, match="bias dtype torch.bfloat16 differs from x dtype torch.float32"):
        npu.npu_moe_gating_top_k(torch.randn(2, 8), 2, bias=torch.zeros(8).bfloat16())
    with pytest.raises(ValueError, match="k=5 must be in"):
        npu.npu_moe_gating_top_k(torch.randn(2, 8), 5, k_group=1, group_count=4)
    with pytest.raises(ValueError, match="not sorted"):
        npu.npu_moe_compute_expert_tokens(torch.tensor([1, 0], dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="outside the 2 expanded rows"):
        npu.npu_moe_finalize_routing(torch.randn(2, 4), None, None, None, torch.ones(1, 2), ids[0] + 5, None)
    w = torch.randn(2, 4, 3)
    with pytest.raises(ValueError, match="1-D group_list of 2 entries"):
        npu.npu_grouped_matmul([x], [w], group_list=torch.tensor([3]), split_item=2, group_type=0)
    with pytest.raises(ValueError, match="covers 5 rows, x has 3"):
        npu.npu_grouped_matmul([x], [w], group_list=torch.tensor([2, 3]), split_item=2, group_type=0, group_list_type=1)
    with pytest.raises(NotImplementedError, match="split_item=0 with group_type 0"):
        npu.npu_grouped_matmul([x], [w], group_list=torch.tensor([1, 3]), split_item=0, group_type=0)
    with pytest.raises(NotImplementedError, match="quantized grouped matmul \\(scale\\)"):
        npu.npu_grouped_matmul([x], [w[0]], scale=[torch.ones(3)])


def test_mc2_ops_name_a_missing_communicator():
    x, ids = torch.randn(2, 4), torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="Expected a value of type 'str' for argument 'group_ep'"):
        npu.npu_moe_distribute_dispatch(x, ids, None, 1, 0, 2)  # the wheel's schema: str group_ep, no None
    with pytest.raises(KeyError, match="no process group is registered under the HCCL communicator name 'nope'"):
        npu.npu_moe_distribute_dispatch(x=x, expert_ids=ids, group_ep="nope", ep_world_size=1, ep_rank_id=0,
                                        moe_expert_num=2)  # fmt: skip
    with pytest.raises(ValueError, match="global_bs=3 must be 0 or at least"):
        npu.npu_moe_distribute_dispatch(x, ids, "nope", 2, 0, 2, global_bs=3)
    with pytest.raises(NotImplementedError, match="quant_mode=2"):
        npu.npu_moe_distribute_dispatch(x, ids, "nope", 1, 0, 2, quant_mode=2)
    assert "nope" not in hccl_names.registered_names()


def test_registration_is_idempotent_and_exposed_by_the_stand_in():
    assert register_moe_ops() == OPS
    # the stand-in torch_npu in a fresh process: the ops under their torch_npu names; dispatch_v2 present, as in
    # the torch_npu 2.5.1.post1 wheel, so vllm-ascend's MC2 path calls the v2 pair (A3's); the EP1 chain on npu
    # tensors
    probe = (
        "from verl_patches import npu_emulation; assert npu_emulation.install_on_cpu_host(); import torch, torch_npu\n"
        "from tests.npu_emulation.moe_reference import tiny_moe, fused_experts_ep1\n"
        "args = tiny_moe(); on_npu = fused_experts_ep1(*[a.to('npu') for a in args])\n"
        "print(torch_npu.npu_moe_init_routing is torch.ops.npu.npu_moe_init_routing, "
        "hasattr(torch_npu, 'npu_moe_distribute_dispatch_v2'), callable(torch_npu.npu_moe_distribute_combine), "
        "on_npu.device.type, torch.equal(on_npu.cpu(), fused_experts_ep1(*args)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "True", "npu", "True"]
