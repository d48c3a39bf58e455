"""The inference ops vllm-ascend's DeepSeek-V3 path calls outside the MoE layer (MLA attention, KV cache, rope,
norms, sampler), each against an independent reference formula (naive loops over sequences, tokens and
heads; rotations as complex products), in fp32 and bf16; as registered custom ops they trace as one opaque
node under torch.compile(fullgraph=True) and give the eager result; torch_npu exposes the registered ops."""

from __future__ import annotations

import functools
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from verl_patches.npu_emulation import catalog
from verl_patches.npu_emulation.ops.inference_registry import INFERENCE_OPS, register_inference_ops
from verl_patches.npu_emulation.wheel_contract.contract import wheel_contract

D64 = torch.float64
BF16_TOL = {"atol": 3e-2, "rtol": 2e-2}


@pytest.fixture(autouse=True)
def _registered():
    register_inference_ops()
    yield
    torch._dynamo.reset()


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=D64).to(dtype)


def close(actual, expected, dtype, tol=1e-5):
    if dtype == torch.bfloat16:
        torch.testing.assert_close(actual.double(), expected.double(), **BF16_TOL)
    else:
        torch.testing.assert_close(actual.double(), expected.double(), atol=tol, rtol=tol)


def traced(fn, *args):
    """Run fn under torch.compile(fullgraph=True); return its result and the call targets of the graph."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    result = torch.compile(fn, fullgraph=True, backend=backend)(*args)
    targets = [str(n.target) for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    return result, targets


def assert_opaque(targets, qualified):
    """The op is one node of the graph and nothing it computes with leaks into the graph."""
    assert any(t.startswith(qualified) for t in targets), targets
    inner = ("einsum", "logsumexp", "softmax", "rsqrt", "sort", "scatter", "index_put", "setitem", "repeat_interleave")
    assert not any(word in t for t in targets for word in inner), targets


# ---- independent references -----------------------------------------------------------------------------
def ref_rms_norm(x, gamma, eps):
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * gamma.double()


def ref_rotate_pairs(x_first, x_second, theta):
    """Rotate each pair (a, b) by theta as the complex product (a + ib) e^(i theta): (real, imag)."""
    z = torch.complex(x_first.double(), x_second.double()) * torch.polar(torch.ones_like(theta), theta)
    return z.real, z.imag


def ref_gather(cache, table_row, length):
    """Token p of a sequence: row p % block_size of block table_row[p // block_size] (a loop, token by token)."""
    bs = cache.shape[1]
    rows = [cache[int(table_row[p // bs]), p % bs] for p in range(length)]
    return torch.stack(rows) if rows else cache.new_zeros(0, *cache.shape[2:])


def ref_attention(q, k, v, scale, blocked=None):
    """q [Sq, N, D], k [Skv, Nkv, D], v [Skv, Nkv, Dv]; query head n reads key/value head n // (N / Nkv);
    blocked[i][j] True hides key j from query i. A row with no key gives 0 and lse -inf. float64."""
    sq, n, _ = q.shape
    skv, nkv, dv = v.shape
    out = torch.zeros(sq, n, dv, dtype=D64)
    lse = torch.full((sq, n), float("-inf"), dtype=D64)
    for h in range(n):
        kh, vh = k[:, h // (n // nkv)].double(), v[:, h // (n // nkv)].double()
        for i in range(sq):
            keys = [j for j in range(skv) if blocked is None or not blocked[i][j]]
            if not keys:
                continue
            scores = scale * (kh[keys] @ q[i, h].double())
            out[i, h] = torch.softmax(scores, 0) @ vh[keys]
            lse[i, h] = torch.logsumexp(scores, 0)
    return out, lse


# ---- registration and exposure ----------------------------------------------------------------------------
def test_registration_is_idempotent_and_torch_npu_exposes_the_registered_ops(torch_npu):
    first, second = register_inference_ops(), register_inference_ops()
    assert first.packets == second.packets
    for op in INFERENCE_OPS:
        packet = getattr(getattr(torch.ops, op.namespace), op.name)
        assert (op.overload or "default") in packet.overloads()
    # where the wheel's torch_npu puts them: torch_npu.<name> for the npu:: ops of its custom_ops.py and ATB's
    # API_LIST, torch_npu.atb.<name> for ATB_API_LIST, nowhere for an overload or TorchAir's npu_inference:: namespace
    contract = wheel_contract()
    assert set(first.packets) == {contract.exposed_as(op.op) for op in INFERENCE_OPS} - {None}
    assert {"npu_fused_infer_attention_score", "atb.npu_ring_mla", "_npu_reshape_and_cache"} <= set(first.packets)
    assert contract.exposed_as("npu_inference::npu_kv_rmsnorm_rope_cache") is None
    assert contract.exposed_as("atb::npu_paged_cache_load.out") is None
    for where, packet in first.packets.items():
        holder, _, name = where.rpartition(".")
        owner = torch_npu.atb if holder == "atb" else torch_npu
        assert getattr(owner, name) is packet, where
    assert torch_npu.atb is sys.modules["torch_npu.atb"]
    from torch_npu.op_plugin.atb._atb_ops import _register_atb_extensions

    assert _register_atb_extensions() is None  # vllm-ascend's NPUWorker start-up hook stays harmless


def test_every_inference_op_is_in_the_catalog():
    listed = {op.implementation for op in catalog.OPS}
    for op in INFERENCE_OPS:
        if not op.overload:  # an out= form shares its op's entry ("(+ .out)")
            assert f"{op.kernel.__module__}:{op.kernel.__name__}" in listed, op.name


# ---- npu_add_rms_norm --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_is_rms_norm_of_the_sum(dtype):
    x1, x2, g = rand(3, 5, 16, dtype=dtype, seed=1), rand(3, 5, 16, dtype=dtype, seed=2), rand(16, dtype=dtype, seed=3)
    y, rstd, x = torch.ops.npu.npu_add_rms_norm(x1, x2, g, 1e-6)
    s = x1.double() + x2.double()
    assert y.dtype == x.dtype == dtype and rstd.dtype == torch.float32 and rstd.shape == (3, 5, 1)
    close(x, s, dtype)
    close(y, ref_rms_norm(s, g, 1e-6), dtype)
    close(rstd, 1 / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6), torch.float32)


def test_add_rms_norm_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="differ in shape"):
        torch.ops.npu.npu_add_rms_norm(rand(2, 4), rand(3, 4), rand(4))
    with pytest.raises(ValueError, match="gamma"):
        torch.ops.npu.npu_add_rms_norm(rand(2, 4), rand(2, 4), rand(5))


# ---- rope ------------------------------------------------------------------------------------------------
def deepseek_cos_sin(theta, dtype):
    """vllm-ascend's DeepSeek caches: cos/sin of cat(freqs, freqs), for a de-interleaved rotate-half rope."""
    both = torch.cat((theta, theta), -1)
    return both.cos().to(dtype), both.sin().to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_interleave_rope_rotates_adjacent_pairs_into_half_layout(dtype):
    b, n, d = 4, 3, 8
    x = rand(b, n, 1, d, dtype=dtype, seed=4)
    theta = torch.rand(b, 1, 1, d // 2, dtype=D64) * 6
    cos, sin = deepseek_cos_sin(theta, dtype)
    out = torch.ops.npu.npu_interleave_rope(x, cos, sin)
    re, im = ref_rotate_pairs(x[..., 0::2], x[..., 1::2], theta)
    assert out.dtype == dtype and out.shape == x.shape
    close(out, torch.cat((re, im), -1), dtype)


def test_interleave_rope_with_arbitrary_cos_sin_follows_the_documented_formula():
    x, cos, sin = rand(2, 2, 3, 6, seed=5), rand(2, 1, 3, 6, seed=6), rand(2, 1, 3, 6, seed=7)
    out = torch.ops.npu_inference.npu_interleave_rope(x, cos, sin)  # the V0 backend's namespace, same op
    x1, x2 = x[..., 0::2], x[..., 1::2]
    close(out, torch.cat((x1, x2), -1) * cos + torch.cat((-x2, x1), -1) * sin, torch.float32)
    with pytest.raises(ValueError, match="4-D"):
        torch.ops.npu.npu_interleave_rope(x[0], cos[0], sin[0])
    with pytest.raises(ValueError, match="last dim"):
        torch.ops.npu.npu_interleave_rope(x, cos[..., :4], sin[..., :4])


@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotary_embedding_rotates_query_and_key_in_place(neox, dtype):
    t, hq, hk, head, rot = 5, 3, 1, 12, 8  # rot < head: the rest of each head stays
    q, k = rand(t, hq * head, dtype=dtype, seed=8), rand(t, hk, head, dtype=dtype, seed=9)
    q0, k0 = q.clone(), k.clone()
    theta_table = torch.rand(20, rot // 2, dtype=D64) * 6
    cache = torch.cat((theta_table.cos(), theta_table.sin()), -1).to(dtype)
    positions = torch.tensor([3, 0, 19, 7, 7])
    assert torch.ops.atb._npu_rotary_embedding(positions, q, k, head, cache, neox) is None
    theta = theta_table[positions].unsqueeze(1)
    for before, after in ((q0.view(t, hq, head), q.view(t, hq, head)), (k0, k)):
        part = before[..., :rot]
        first, second = (part[..., : rot // 2], part[..., rot // 2 :]) if neox else (part[..., 0::2], part[..., 1::2])
        re, im = ref_rotate_pairs(first, second, theta)
        expected = torch.cat((re, im), -1) if neox else torch.stack((re, im), -1).flatten(-2)
        close(after[..., :rot], expected, dtype)
        assert torch.equal(after[..., rot:], before[..., rot:])


# ---- KV cache writes and loads ------------------------------------------------------------------------------
def test_reshape_and_cache_writes_each_slot_and_skips_padding():
    nb, bs, n = 4, 4, 1
    kc, vc = torch.zeros(nb, bs, n, 6), torch.zeros(nb, bs, n, 3)
    key, value = rand(5, n, 6, seed=10), rand(5, n, 3, seed=11)
    slots = torch.tensor([5, 0, -1, 15, 9])
    torch.ops.atb._npu_reshape_and_cache(key=key, value=value, key_cache=kc, value_cache=vc, slot_indices=slots)
    expected_k, expected_v = torch.zeros_like(kc), torch.zeros_like(vc)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expected_k[s // bs, s % bs], expected_v[s // bs, s % bs] = key[t], value[t]
    assert torch.equal(kc, expected_k) and torch.equal(vc, expected_v)
    with pytest.raises(IndexError, match="beyond the cache"):
        torch.ops.atb._npu_reshape_and_cache(key, value, kc, vc, torch.tensor([0, 1, 2, 3, 16]))
    with pytest.raises(ValueError, match="do not fit"):
        torch.ops.atb._npu_reshape_and_cache(key[:, :, :4], value, kc, vc, slots)


@pytest.mark.parametrize("cumsum", [False, True])
def test_paged_cache_load_gathers_each_sequence_from_its_start(cumsum):
    nb, bs = 8, 4
    kc, vc = rand(nb, bs, 1, 6, seed=12), rand(nb, bs, 1, 2, seed=13)
    table = torch.tensor([[3, 1, 6], [0, 7, 2], [5, 4, 4]], dtype=torch.int32)
    lens, starts = [5, 0, 3], [4, 4, 0]
    # int32 lengths and starts, as the kernel documents and vllm-ascend passes them
    ctx = (torch.tensor(lens).cumsum(0) if cumsum else torch.tensor(lens)).to(torch.int32)
    starts_t = torch.tensor(starts, dtype=torch.int32)
    key, value = torch.ops.atb.npu_paged_cache_load(kc, vc, table, ctx, seq_starts=starts_t, cumsum=cumsum)
    exp_k = torch.cat([ref_gather(kc, table[b], starts[b] + lens[b])[starts[b] :] for b in range(3)])
    exp_v = torch.cat([ref_gather(vc, table[b], starts[b] + lens[b])[starts[b] :] for b in range(3)])
    assert torch.equal(key, exp_k) and torch.equal(value, exp_v)
    out_k, out_v = torch.empty(8, 1, 6), torch.empty(8, 1, 2)
    torch.ops.atb.npu_paged_cache_load(kc, vc, table, ctx, seq_starts=starts_t, cumsum=cumsum, key=out_k, value=out_v)
    assert torch.equal(out_k, exp_k) and torch.equal(out_v, exp_v)
    with pytest.raises(ValueError, match="out key"):
        torch.ops.atb.npu_paged_cache_load(kc, vc, table, ctx, cumsum=cumsum, key=torch.empty(7, 1, 6), value=out_v)
    with pytest.raises(IndexError, match="block-table column"):
        torch.ops.atb.npu_paged_cache_load(kc, vc, table, torch.tensor([13, 0, 0], dtype=torch.int32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kv_rmsnorm_rope_cache_pa_normalises_rotates_and_writes_the_caches(dtype):
    b, dv, dk, nb, bs, eps = 5, 16, 8, 3, 4, 1e-6
    kv = rand(b, 1, 1, dv + dk, dtype=dtype, seed=14)
    gamma = rand(dv, dtype=dtype, seed=15)
    theta = torch.rand(b, 1, 1, dk // 2, dtype=D64) * 6
    cos, sin = deepseek_cos_sin(theta, dtype)
    slots = torch.tensor([2, -1, 11, 4, 7])
    k_cache, ckv_cache = torch.zeros(nb, bs, 1, dk, dtype=dtype), torch.zeros(nb, bs, 1, dv, dtype=dtype)
    outs = torch.ops.npu.npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, slots, k_cache, ckv_cache, epsilon=eps, cache_mode="PA", is_output_kv=True
    )
    assert outs[0] is k_cache and outs[1] is ckv_cache  # the caches themselves, updated in place
    y_ref = ref_rms_norm(kv[..., :dv], gamma, eps)
    re, im = ref_rotate_pairs(kv[..., dv:][..., 0::2], kv[..., dv:][..., 1::2], theta)
    k_ref = torch.cat((re, im), -1)
    close(outs[2], k_ref, dtype)
    close(outs[3], y_ref, dtype)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            close(k_cache[s // bs, s % bs, 0], k_ref[t, 0, 0], dtype)
            close(ckv_cache[s // bs, s % bs, 0], y_ref[t, 0, 0], dtype)
    written = {s for s in slots.tolist() if s >= 0}
    untouched = [s for s in range(nb * bs) if s not in written]
    assert all(not k_cache[s // bs, s % bs].any() and not ckv_cache[s // bs, s % bs].any() for s in untouched)


def test_kv_rmsnorm_rope_cache_norm_mode_writes_per_sequence_offsets():
    b, s, dv, dk, length = 2, 3, 8, 4, 6
    kv, gamma = rand(b, 1, s, dv + dk, seed=16), rand(dv, seed=17)
    cos, sin = rand(b, 1, s, dk, seed=18), rand(b, 1, s, dk, seed=19)
    index = torch.tensor([[5, 0, 2], [1, 3, 4]])
    k_cache, ckv_cache = torch.zeros(b, 1, length, dk), torch.zeros(b, 1, length, dv)
    _, _, k, y = torch.ops.npu_inference.npu_kv_rmsnorm_rope_cache(
        kv, gamma, cos, sin, index, k_cache, ckv_cache, epsilon=1e-5, cache_mode="Norm"
    )
    for bb in range(b):
        for ss in range(s):
            assert torch.equal(k_cache[bb, 0, index[bb, ss]], k[bb, 0, ss])
            assert torch.equal(ckv_cache[bb, 0, index[bb, ss]], y[bb, 0, ss])
    close(y, ref_rms_norm(kv[..., :dv], gamma, 1e-5), torch.float32)


def test_kv_rmsnorm_rope_cache_refuses_nz_modes_quantization_and_unknown_modes():
    kv, gamma, cs = rand(2, 1, 1, 12), rand(8), rand(2, 1, 1, 4)
    kc, cc = torch.zeros(2, 4, 1, 4), torch.zeros(2, 4, 1, 8)
    idx = torch.tensor([0, 1])
    for mode in ("PA_NZ", "PA_BLK_NZ"):
        with pytest.raises(NotImplementedError, match="enable_kv_nz"):
            torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cs, cs, idx, kc, cc, cache_mode=mode)
    with pytest.raises(ValueError, match="cache_mode must be one of"):
        torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cs, cs, idx, kc, cc, cache_mode="pa")
    with pytest.raises(NotImplementedError, match="c_kv_scale"):
        torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cs, cs, idx, kc, cc, c_kv_scale=rand(8), cache_mode="PA")
    with pytest.raises(ValueError, match="one slot per token"):
        torch.ops.npu.npu_kv_rmsnorm_rope_cache(kv, gamma, cs, cs, idx[:1], kc, cc, cache_mode="PA")


# ---- npu_fused_infer_attention_score ------------------------------------------------------------------------
def paged_mla_case(n, lora, rope, bs, lens, dtype, seed):
    """An MLA decode batch: one query token per sequence against a paged latent cache (Nkv = 1)."""
    b = len(lens)
    per_seq = [max(1, -(-length // bs)) for length in lens]
    nb = sum(per_seq) + 1
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(seed))
    table = torch.zeros(b, max(per_seq), dtype=torch.int32)
    used = 0
    for i, count in enumerate(per_seq):
        table[i, :count] = perm[used : used + count]
        used += count
    return {
        "q_nope": rand(b, n, 1, lora, dtype=dtype, seed=seed + 1),
        "q_pe": rand(b, n, 1, rope, dtype=dtype, seed=seed + 2),
        "nope_cache": rand(nb, bs, 1, lora, dtype=dtype, seed=seed + 3),
        "rope_cache": rand(nb, bs, 1, rope, dtype=dtype, seed=seed + 4),
        "table": table,
        "lens": lens,
    }


def ref_paged_mla_decode(case, scale):
    outs = []
    for b, length in enumerate(case["lens"]):
        nope = ref_gather(case["nope_cache"], case["table"][b], length)
        k = torch.cat((nope, ref_gather(case["rope_cache"], case["table"][b], length)), -1)
        q = torch.cat((case["q_nope"][b], case["q_pe"][b]), -1).transpose(0, 1)  # [1, N, L + R]
        out, _ = ref_attention(q, k, nope, scale)
        outs.append(out.transpose(0, 1))
    return torch.stack(outs)  # [B, N, 1, L]


def mla_decode_call(fia, case, scale, bs):
    """The call AscendMLAImpl._forward_decode makes in TorchAir graph mode with enable_kv_nz=False."""
    lora, rope = case["nope_cache"].shape[-1], case["rope_cache"].shape[-1]
    k_nope = case["nope_cache"].view(-1, 1, bs, lora)
    k_pe = case["rope_cache"].view(-1, 1, bs, rope)
    return fia(
        case["q_nope"],
        k_nope,
        k_nope,
        query_rope=case["q_pe"],
        key_rope=k_pe,
        num_heads=case["q_nope"].shape[1],
        num_key_value_heads=1,
        input_layout="BNSD",
        atten_mask=None,
        sparse_mode=0,
        scale=scale,
        antiquant_mode=0,
        antiquant_scale=None,
        block_table=case["table"],
        block_size=bs,
        actual_seq_lengths_kv=case["lens"],
        actual_seq_lengths=None,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fia_mla_decode_over_a_paged_cache_matches_attention_over_the_gathered_tokens(dtype):
    n, lora, rope, bs = 4, 16, 8, 16  # block size 16 or 128: what FIA takes with query_rope
    case = paged_mla_case(n, lora, rope, bs, [5, 0, 8, 1], dtype, seed=20)  # 0: a padded graph batch entry
    out, lse = mla_decode_call(torch.ops.npu.npu_fused_infer_attention_score, case, 0.3, bs)
    assert out.shape == (4, n, 1, lora) and out.dtype == dtype
    assert lse.shape == (1,) and lse.dtype == torch.float32 and not lse.any()
    close(out, ref_paged_mla_decode(case, 0.3), dtype)
    assert not out[1].any()  # nothing to attend to: zeros, never NaN


def test_fia_mla_decode_at_deepseek_v3_dims():
    n, lora, rope, bs = 128, 512, 64, 128
    case = paged_mla_case(n, lora, rope, bs, [130, 3], torch.float32, seed=30)
    out, _ = mla_decode_call(torch.ops.npu.npu_fused_infer_attention_score, case, 1 / math.sqrt(192), bs)
    close(out, ref_paged_mla_decode(case, 1 / math.sqrt(192)), torch.float32, tol=1e-4)


def test_fia_tnd_spec_decode_is_causal_bottom_right_per_sequence():
    n, lora, rope, bs = 2, 8, 4, 16
    q_lens, kv_lens = [2, 1, 3], [6, 3, 9]
    case = paged_mla_case(n, lora, rope, bs, kv_lens, torch.float32, seed=40)
    t = sum(q_lens)
    qn, qp = rand(t, n, lora, seed=41), rand(t, n, rope, seed=42)
    k_nope = case["nope_cache"].view(-1, 1, bs, lora)
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(
        qn,
        k_nope,
        k_nope,
        query_rope=qp,
        key_rope=case["rope_cache"].view(-1, 1, bs, rope),
        num_heads=n,
        num_key_value_heads=1,
        input_layout="TND",
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        sparse_mode=3,
        scale=0.5,
        block_table=case["table"],
        block_size=bs,
        actual_seq_lengths_kv=kv_lens,
        actual_seq_lengths=torch.tensor(q_lens).cumsum(0).tolist(),
    )
    start = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        nope = ref_gather(case["nope_cache"], case["table"][b], kl)
        k = torch.cat((nope, ref_gather(case["rope_cache"], case["table"][b], kl)), -1)
        q = torch.cat((qn[start : start + ql], qp[start : start + ql]), -1)
        blocked = [[j > i + kl - ql for j in range(kl)] for i in range(ql)]
        close(out[start : start + ql], ref_attention(q, k, nope, 0.5, blocked)[0], torch.float32)
        start += ql


@pytest.mark.parametrize("layout", ["BSND", "BNSD", "BSH"])
def test_fia_contiguous_kv_with_mask_gqa_and_lse(layout):
    b, s, skv, n, nkv, d, dv = 2, 3, 5, 4, 2, 8, 8  # the output has the query's shape (D_v = D_q)
    q, k, v = rand(b, s, n, d, seed=50), rand(b, skv, nkv, d, seed=51), rand(b, skv, nkv, dv, seed=52)
    mask = torch.rand(b, 1, s, skv, generator=torch.Generator().manual_seed(53)) < 0.3
    mask[..., 0] = False
    kv_lens = [5, 4]

    def to(x):
        return {"BSND": x, "BNSD": x.transpose(1, 2), "BSH": x.flatten(2)}[layout]

    out, lse = torch.ops.npu.npu_fused_infer_attention_score(
        to(q),
        to(k),
        to(v),
        atten_mask=mask.to(torch.uint8),
        num_heads=n,
        num_key_value_heads=nkv,
        scale=0.4,
        input_layout=layout,
        actual_seq_lengths_kv=kv_lens,
        softmax_lse_flag=True,
    )
    assert lse.shape == (b, n, s, 1)
    for bb in range(b):
        blocked = [[bool(mask[bb, 0, i, j]) or j >= kv_lens[bb] for j in range(skv)] for i in range(s)]
        ref_out, ref_lse = ref_attention(q[bb], k[bb], v[bb], 0.4, blocked)
        got = {"BSND": out[bb], "BNSD": out[bb].transpose(0, 1), "BSH": out[bb].view(s, n, dv)}[layout]
        close(got, ref_out, torch.float32)
        close(lse[bb, :, :, 0].transpose(0, 1), ref_lse, torch.float32)


# what differs from a valid paged MLA decode call, as a function of the case; None leaves the keyword out
FIA_REFUSALS = {
    "layout": (ValueError, "input_layout", lambda case: {"input_layout": "SBH"}),
    "block_table_rows": (ValueError, "block_table", lambda case: {"block_table": case["table"][:1]}),
    "no_kv_lengths": (ValueError, "actual_seq_lengths_kv", lambda case: {"actual_seq_lengths_kv": None}),
    "unpaged_cache": (ValueError, "paged cache must be", lambda case: {"kv": case["nope_cache"]}),
    "nz_cache": (NotImplementedError, "FRACTAL_NZ", lambda case: {"kv": torch.zeros(4, 1, 1, 4, 16)}),
    "antiquant": (NotImplementedError, "antiquant_scale", lambda case: {"antiquant_scale": torch.ones(2)}),
    "heads": (ValueError, "heads", lambda case: {"num_heads": 3}),
}


@pytest.mark.parametrize("refusal", FIA_REFUSALS)
def test_fia_rejects_bad_layouts_shapes_and_unemulated_features(refusal):
    error, match, change = FIA_REFUSALS[refusal]
    case = paged_mla_case(2, 8, 4, 4, [3, 2], torch.float32, seed=60)
    call = {
        "kv": case["nope_cache"].view(-1, 1, 4, 8),
        "num_heads": 2,
        "num_key_value_heads": 1,
        "input_layout": "BNSD",
        "block_table": case["table"],
        "block_size": 4,
        "actual_seq_lengths_kv": [3, 2],
        **change(case),
    }
    kv = call.pop("kv")
    with pytest.raises(error, match=match):
        torch.ops.npu.npu_fused_infer_attention_score(
            case["q_nope"], kv, kv, **{k: v for k, v in call.items() if v is not None}
        )


# ---- npu_ring_mla -------------------------------------------------------------------------------------------
def ring_inputs(q_lens, kv_lens, n, dn, dr, dv, dtype, seed):
    tq, tk = sum(q_lens), sum(kv_lens)
    return (
        rand(tq, n, dn, dtype=dtype, seed=seed),
        rand(tq, n, dr, dtype=dtype, seed=seed + 1),
        rand(tk, n, dn, dtype=dtype, seed=seed + 2),
        rand(tk, 1, dr, dtype=dtype, seed=seed + 3).expand(tk, n, dr),  # k_pe shared by heads, as MLA expands it
        rand(tk, n, dv, dtype=dtype, seed=seed + 4),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_mla_first_ring_is_causal_attention_per_sequence(dtype):
    q_lens, n, dn, dr, dv = [3, 1, 4], 2, 8, 4, 6
    qn, qr, kn, kr, v = ring_inputs(q_lens, q_lens, n, dn, dr, dv, dtype, seed=70)
    mask = torch.ones(512, 512, dtype=dtype).triu(1)
    out, lse = torch.ops.atb.npu_ring_mla(
        qn,
        qr,
        kn,
        kr,
        v,
        mask,
        torch.tensor(q_lens, dtype=torch.int32),
        n,
        n,
        qk_scale=0.3,
        kernel_type="kernel_type_high_precision",
        mask_type="mask_type_triu",
        input_layout="type_bsnd",
        calc_type="calc_type_first_ring",
    )
    assert out.shape == (8, n, dv) and out.dtype == dtype and lse.shape == (n, 8) and lse.dtype == torch.float32
    start = 0
    for length in q_lens:
        sl = slice(start, start + length)
        blocked = [[j > i for j in range(length)] for i in range(length)]
        ref_out, ref_lse = ref_attention(
            torch.cat((qn[sl], qr[sl]), -1), torch.cat((kn[sl], kr[sl]), -1), v[sl], 0.3, blocked
        )
        close(out[sl], ref_out, dtype)
        close(lse[:, sl].t(), ref_lse, torch.float32 if dtype == torch.float32 else dtype)
        start += length


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ring_mla_merge_with_context_equals_attention_over_the_concatenation(dtype):
    """vllm-ascend's chunked prefill: the new tokens attend causally to themselves (first ring), then each
    context chunk is merged in with calc_type_default writing over pre_out/prev_lse; the result is attention
    over [context, new tokens] with the new tokens ending the sequence."""
    q_lens, ctx_chunks, n, dn, dr, dv = [2, 3], [[3, 0], [2, 0]], 2, 8, 4, 6
    qn, qr, kn, kr, v = ring_inputs(q_lens, q_lens, n, dn, dr, dv, dtype, seed=80)
    mask = torch.ones(512, 512, dtype=dtype).triu(1)
    out, lse = torch.empty(5, n, dv, dtype=dtype), torch.empty(n, 5)
    seq1 = torch.tensor(q_lens, dtype=torch.int32)
    torch.ops.atb.npu_ring_mla(
        q_nope=qn,
        q_rope=qr,
        k_nope=kn,
        k_rope=kr,
        value=v,
        mask=mask,
        seqlen=seq1,
        head_num=n,
        kv_head_num=n,
        pre_out=None,
        prev_lse=None,
        qk_scale=0.3,
        kernel_type="kernel_type_high_precision",
        mask_type="mask_type_triu",
        input_layout="type_bsnd",
        calc_type="calc_type_first_ring",
        output=out,
        softmax_lse=lse,
    )
    contexts = []
    for i, chunk in enumerate(ctx_chunks):
        ckn, ckr, cv = ring_inputs(chunk, chunk, n, dn, dr, dv, dtype, seed=90 + 10 * i)[2:]
        contexts.append((chunk, ckn, ckr, cv))
        torch.ops.atb.npu_ring_mla(
            q_nope=qn,
            q_rope=qr,
            k_nope=ckn,
            k_rope=ckr,
            value=cv,
            mask=mask,
            seqlen=torch.stack([seq1, torch.tensor(chunk, dtype=torch.int32)]),
            head_num=n,
            kv_head_num=n,
            pre_out=out,
            prev_lse=lse,
            qk_scale=0.3,
            kernel_type="kernel_type_high_precision",
            mask_type="no_mask",
            input_layout="type_bsnd",
            calc_type="calc_type_default",
            output=out,
            softmax_lse=lse,
        )
    q_start = 0
    for b, ql in enumerate(q_lens):
        keys, values = [], []
        for chunk, ckn, ckr, cv in contexts:  # the context, chunk after chunk, then the new tokens
            start = sum(chunk[:b])
            sl = slice(start, start + chunk[b])
            keys.append(torch.cat((ckn[sl], ckr[sl]), -1))
            values.append(cv[sl])
        sl = slice(q_start, q_start + ql)
        keys.append(torch.cat((kn[sl], kr[sl]), -1))
        values.append(v[sl])
        k_all, v_all = torch.cat(keys), torch.cat(values)
        ctx = k_all.shape[0] - ql
        blocked = [[j > ctx + i for j in range(k_all.shape[0])] for i in range(ql)]
        ref_out, ref_lse = ref_attention(torch.cat((qn[sl], qr[sl]), -1), k_all, v_all, 0.3, blocked)
        close(out[sl], ref_out, dtype)
        close(lse[:, sl].t(), ref_lse, torch.float32 if dtype == torch.float32 else dtype)
        q_start += ql


def test_ring_mla_rejects_bad_modes_and_lengths():
    qn, qr, kn, kr, v = ring_inputs([2], [2], 1, 4, 2, 3, torch.float32, seed=100)
    mask, seq = torch.zeros(4, 4), torch.tensor([2])
    ring = torch.ops.atb.npu_ring_mla
    with pytest.raises(ValueError, match="calc_type"):
        ring(qn, qr, kn, kr, v, mask, seq, 1, 1, calc_type="calc_type_last_ring")
    with pytest.raises(ValueError, match="input_layout"):
        ring(qn, qr, kn, kr, v, mask, seq, 1, 1, input_layout="type_bnsd")
    with pytest.raises(ValueError, match="pre_out and prev_lse"):
        ring(qn, qr, kn, kr, v, mask, seq, 1, 1, calc_type="calc_type_default")
    with pytest.raises(ValueError, match="seqlen sums"):
        ring(qn, qr, kn, kr, v, mask, torch.tensor([3]), 1, 1)
    with pytest.raises(ValueError, match="seqlen must be"):
        ring(qn, qr, kn, kr, v, mask, torch.ones(3, 1, dtype=torch.int32), 1, 1)


# ---- _npu_paged_attention_mla -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_mla_reads_the_value_from_the_key_prefix(dtype):
    n, lora, rope, bs = 4, 16, 8, 4
    case = paged_mla_case(n, lora, rope, bs, [6, 1, 9], dtype, seed=110)
    q = torch.cat((case["q_nope"], case["q_pe"]), -1).squeeze(2)  # [B, N, L + R]
    k_cache = torch.cat((case["nope_cache"], case["rope_cache"]), -1)
    out = torch.empty(3, n, lora, dtype=dtype)
    res = torch.ops.atb._npu_paged_attention_mla(
        query=q,
        key_cache=k_cache,
        num_kv_heads=1,
        num_heads=n,
        scale_value=0.25,
        block_table=case["table"],
        context_lens=torch.tensor(case["lens"], dtype=torch.int32),
        mla_vheadsize=lora,
        out=out,
    )
    assert res is None
    close(out, ref_paged_mla_decode(case, 0.25).squeeze(2), dtype)
    with pytest.raises(ValueError, match="out"):
        torch.ops.atb._npu_paged_attention_mla(
            q, k_cache, 1, n, 0.25, case["table"], torch.tensor(case["lens"]), lora, torch.empty(3, n, lora + 1)
        )


# ---- npu_top_k_top_p and npu_prefetch -----------------------------------------------------------------------
def ref_top_k_top_p(logits, p, k):
    """Row by row: drop below the k-th largest; then walk the survivors from the least likely, dropping each
    while the probability mass walked so far stays <= 1 - p; never the most likely."""
    out = torch.full_like(logits, float("-inf"))
    for b in range(logits.shape[0]):
        row = logits[b].double()
        kth = sorted(row.tolist(), reverse=True)[int(k[b]) - 1]
        kept = [v for v in range(row.numel()) if row[v] >= kth]
        probs = torch.softmax(row[kept], 0)
        order = sorted(range(len(kept)), key=lambda i: (row[kept[i]].item(), kept[i]))  # ascending, stable
        mass = 0.0
        dropped = set()
        for pos, i in enumerate(order):
            mass += probs[i].item()
            if pos < len(order) - 1 and mass <= 1 - float(p[b]):
                dropped.add(kept[i])
        for v in kept:
            if v not in dropped:
                out[b, v] = logits[b, v]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_top_k_top_p_matches_the_row_by_row_filter(dtype):
    logits = rand(4, 40, dtype=dtype, seed=120) * 3
    p = torch.tensor([0.9, 0.5, 1.0, 0.05], dtype=dtype)  # p in logits' dtype, as the kernel documents
    k = torch.tensor([40, 5, 1, 12], dtype=torch.int32)  # 40: the whole vocab, as vLLM passes top_k = -1
    out = torch.ops.npu.npu_top_k_top_p(logits, p, k)
    assert out.dtype == dtype and torch.equal(out, ref_top_k_top_p(logits, p, k))
    assert torch.isfinite(out[2]).sum() == 1  # k = 1 keeps the argmax alone


def test_top_k_top_p_rejects_out_of_range_k_and_misordered_arguments():
    logits = rand(2, 10)
    with pytest.raises(ValueError, match=r"at most logits.size\(1\)"):
        torch.ops.npu.npu_top_k_top_p(logits, torch.tensor([0.9, 0.9]), torch.tensor([11, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="p is a torch.int32 tensor"):
        torch.ops.npu.npu_top_k_top_p(logits, torch.tensor([3, 2], dtype=torch.int32), torch.tensor([0.9, 0.9]))


def test_prefetch_is_a_checked_no_op():
    w, x = rand(4, 4), rand(2, 4)
    w0 = w.clone()
    assert torch.ops.npu.npu_prefetch(w, x, 64) is None and torch.equal(w, w0)
    with pytest.raises(ValueError, match="max_size"):
        torch.ops.npu.npu_prefetch(w, x, 0)


# ---- traced by dynamo (fullgraph) as opaque ops --------------------------------------------------------------
def test_mla_decode_graph_traces_every_op_as_one_node(torch_npu):
    """The TorchAir decode step's op sequence, called through torch_npu as vllm-ascend calls it."""
    n, lora, rope, bs = 4, 16, 8, 16
    case = paged_mla_case(n, lora, rope, bs, [5, 2, 8], torch.float32, seed=130)
    kv = rand(3, 1, 1, lora + rope, seed=131)
    gamma = rand(lora, seed=132)
    cos, sin = deepseek_cos_sin(torch.rand(3, 1, 1, rope // 2, dtype=D64), torch.float32)
    slots = torch.tensor([4, 7, -1])

    def decode(kv, q_pe, nope_cache, rope_cache, table):
        torch_npu.npu_prefetch(nope_cache, kv, 64)
        k_pe, k_nope, _, _ = torch_npu.npu_kv_rmsnorm_rope_cache(
            kv, gamma, cos, sin, slots, rope_cache, nope_cache, epsilon=1e-6, cache_mode="PA"
        )
        q_pe = torch_npu.npu_interleave_rope(q_pe, cos, sin)
        out, _ = torch_npu.npu_fused_infer_attention_score(
            case["q_nope"],
            k_nope.view(-1, 1, bs, lora),
            k_nope.view(-1, 1, bs, lora),
            query_rope=q_pe,
            key_rope=k_pe.view(-1, 1, bs, rope),
            num_heads=n,
            num_key_value_heads=1,
            input_layout="BNSD",
            atten_mask=None,
            sparse_mode=0,
            scale=0.3,
            antiquant_mode=0,
            antiquant_scale=None,
            block_table=table,
            block_size=bs,
            actual_seq_lengths_kv=case["lens"],
            actual_seq_lengths=None,
        )
        return out

    eager_caches = (case["nope_cache"].clone(), case["rope_cache"].clone())
    expected = decode(kv, case["q_pe"], *eager_caches, case["table"])
    graph_caches = (case["nope_cache"].clone(), case["rope_cache"].clone())
    got, targets = traced(decode, kv, case["q_pe"], *graph_caches, case["table"])
    torch.testing.assert_close(got, expected)
    assert all(torch.equal(a, b) for a, b in zip(graph_caches, eager_caches))  # the in-place cache writes ran
    for name in ("npu.npu_kv_rmsnorm_rope_cache", "npu.npu_interleave_rope", "npu.npu_fused_infer_attention_score"):
        assert_opaque(targets, name)


def _cache_write(torch_npu, kc, vc, key, value):
    torch_npu._npu_reshape_and_cache(
        key=key, value=value, key_cache=kc, value_cache=vc, slot_indices=torch.tensor([1, 6])
    )
    return kc + 0, vc + 0


def _rotary(torch_npu, q, k, cache):
    torch_npu._npu_rotary_embedding(torch.tensor([1, 0]), q, k, 4, cache, True)
    return q + 0, k + 0


def _paged_mla(torch_npu, q, k_cache, table, out):
    torch_npu._npu_paged_attention_mla(q, k_cache, 1, 2, 0.3, table, torch.tensor([5, 3]), 8, out)
    return out + 0


def _ring(torch_npu, qn, qr, kn, kr, v, out, lse):
    torch_npu.atb.npu_ring_mla(
        q_nope=qn,
        q_rope=qr,
        k_nope=kn,
        k_rope=kr,
        value=v,
        mask=torch.ones(4, 4),
        seqlen=torch.tensor([2, 3]),
        head_num=2,
        kv_head_num=2,
        qk_scale=0.3,
        mask_type="mask_type_triu",
        calc_type="calc_type_first_ring",
        output=out,
        softmax_lse=lse,
    )
    return out + 0, lse + 0


def _cache_load(torch_npu, kc, vc, table, key, value):
    torch_npu.atb.npu_paged_cache_load(
        kc,
        vc,
        table,
        torch.tensor([5, 3], dtype=torch.int32),
        seq_starts=torch.tensor([0, 0], dtype=torch.int32),
        key=key,
        value=value,
    )
    return key + 0, value + 0


def _top_k_top_p(torch_npu, x):
    return torch_npu.npu_top_k_top_p(x, torch.tensor([0.8, 0.6]), torch.tensor([4, 6], dtype=torch.int32))


def _add_rms_norm(torch_npu, a, b):
    return torch_npu.npu_add_rms_norm(a, b, torch.ones(8), 1e-6)


@pytest.mark.parametrize(
    "name",
    [
        "add_rms_norm",
        "top_k_top_p",
        "reshape_and_cache",
        "rotary_embedding",
        "paged_attention_mla",
        "ring_mla",
        "paged_cache_load",
    ],
)
def test_each_remaining_op_traces_opaque_and_matches_eager(torch_npu, name):
    case = paged_mla_case(2, 8, 4, 4, [5, 3], torch.float32, seed=140)
    ring = ring_inputs([2, 3], [2, 3], 2, 8, 4, 6, torch.float32, seed=141)
    k_cache = torch.cat((case["nope_cache"], case["rope_cache"]), -1)
    q = torch.cat((case["q_nope"], case["q_pe"]), -1).squeeze(2)
    calls = {  # name: (the op as the graph names it, the function, its inputs (cloned per run))
        "add_rms_norm": ("npu.npu_add_rms_norm", _add_rms_norm, (rand(3, 8, seed=1), rand(3, 8, seed=2))),
        "top_k_top_p": ("npu.npu_top_k_top_p", _top_k_top_p, (rand(2, 10, seed=3),)),
        "reshape_and_cache": (
            "atb._npu_reshape_and_cache",
            _cache_write,
            (torch.zeros(3, 4, 1, 8), torch.zeros(3, 4, 1, 4), rand(2, 1, 8, seed=4), rand(2, 1, 4, seed=5)),
        ),
        "rotary_embedding": (
            "atb._npu_rotary_embedding",
            _rotary,
            (rand(2, 8, seed=6), rand(2, 4, seed=7), rand(3, 4, seed=8)),
        ),
        "paged_attention_mla": (
            "atb._npu_paged_attention_mla",
            _paged_mla,
            (q, k_cache, case["table"], torch.empty(2, 2, 8)),
        ),
        "ring_mla": ("atb.npu_ring_mla", _ring, (*ring, torch.empty(5, 2, 6), torch.empty(2, 5))),
        "paged_cache_load": (
            "atb.npu_paged_cache_load",
            _cache_load,
            (case["nope_cache"], case["rope_cache"], case["table"], torch.empty(8, 1, 8), torch.empty(8, 1, 4)),
        ),
    }
    qualified, fn, args = calls[name]
    expected = fn(torch_npu, *[a.clone() for a in args])
    got, targets = traced(functools.partial(fn, torch_npu), *[a.clone() for a in args])
    torch.testing.assert_close(got, expected)
    assert_opaque(targets, qualified)


def test_paged_cache_load_sized_by_its_lengths_traces_with_dynamic_output_shapes(torch_npu):
    """The functional form's output length is the sum of context_lens (data): like torch_npu's, its fake makes an
    unbacked size, which dynamo captures when capture_dynamic_output_shape_ops is on."""
    case = paged_mla_case(2, 8, 4, 4, [5, 3], torch.float32, seed=150)

    def load(kc, vc, table, lens):
        return torch_npu.atb.npu_paged_cache_load(kc, vc, table, lens)

    args = (case["nope_cache"], case["rope_cache"], case["table"], torch.tensor([5, 3], dtype=torch.int32))
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        got, targets = traced(load, *args)
    torch.testing.assert_close(got, load(*args))
    assert got[0].shape == (8, 1, 8)
    assert_opaque(targets, "atb.npu_paged_cache_load")


# ---- vllm-ascend's AscendMLAImpl.forward on the emulated ops, against plain (non-absorbed) MLA --------------
HID, HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_DIM, BLOCK = 32, 4, 16, 16, 16, 8, 16, 16  # FIA's block size: 16 or 128
THETA = torch.outer(torch.arange(64, dtype=D64), 1.0 / 10000 ** (torch.arange(0, ROPE, 2, dtype=D64) / ROPE))


class _Proj:
    """A linear layer as vLLM's linear layers return it: (x W^T, bias)."""

    def __init__(self, out_f, in_f, seed, dtype):
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod  # lazy: needs vLLM imported

        self.weight = rand(out_f, in_f, dtype=dtype, seed=seed) / math.sqrt(in_f)
        self.quant_method = UnquantizedLinearMethod()

    def __call__(self, x):
        return x @ self.weight.t(), None


class _Norm:
    def __init__(self, n, seed, dtype):
        self.weight, self.variance_epsilon = 1 + 0.1 * rand(n, dtype=dtype, seed=seed), 1e-6

    def __call__(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.float()).to(x.dtype)


@pytest.fixture()
def mla_v1(vllm_job_process):
    import vllm_ascend.attention.mla_v1 as mla  # lazy: vLLM is imported by the fixture, as a rollout worker does

    return mla


def deepseek_rope_tables(dtype):
    """vllm-ascend's DeepSeek caches: cos/sin_cached of cat(freqs, freqs) (graph mode) and the cos|sin cache
    of its rotary embedding (eager decode), for positions 0..63."""
    both = torch.cat((THETA, THETA), -1)
    return both.cos().to(dtype), both.sin().to(dtype), torch.cat((THETA.cos(), THETA.sin()), -1).to(dtype)


def make_mla_impl(mla, dtype):
    """AscendMLAImpl as its __init__ and process_weights_after_loading leave it: TorchAir on, KV-NZ off."""
    from vllm_ascend.ops.rotary_embedding import native_rope_deepseek_forward  # lazy: needs vLLM imported

    rope = SimpleNamespace(
        cos_sin_cache=deepseek_rope_tables(dtype)[2], is_neox_style=False, head_size=ROPE, rotary_dim=ROPE
    )
    impl = object.__new__(mla.AscendMLAImpl)
    impl.__dict__.update(
        num_heads=HEADS,
        head_size=KV_LORA + ROPE,
        scale=1 / math.sqrt(NOPE + ROPE),
        num_kv_heads=1,
        kv_cache_dtype="auto",
        q_lora_rank=Q_LORA,
        kv_lora_rank=KV_LORA,
        qk_nope_head_dim=NOPE,
        qk_rope_head_dim=ROPE,
        qk_head_dim=NOPE + ROPE,
        v_head_dim=V_DIM,
        rotary_emb=lambda pos, q, k: native_rope_deepseek_forward(rope, pos, q, k),
        q_proj=_Proj(HEADS * (NOPE + ROPE), Q_LORA, 1, dtype),
        kv_b_proj=_Proj(HEADS * (NOPE + V_DIM), KV_LORA, 2, dtype),
        o_proj=_Proj(HID, HEADS * V_DIM, 3, dtype),
        kv_a_proj_with_mqa=_Proj(KV_LORA + ROPE, HID, 4, dtype),
        kv_a_layernorm=_Norm(KV_LORA, 5, dtype),
        num_queries_per_kv=HEADS,
        torchair_graph_enabled=True,
        enable_kv_nz=False,
    )
    impl.process_weights_after_loading(dtype)
    return impl


def ref_rope_at(x, pos):
    re, im = ref_rotate_pairs(x[..., 0::2], x[..., 1::2], THETA[pos])
    return torch.cat((re, im), -1)


def ref_plain_mla(impl, q_c, hidden, positions, contexts):
    """MLA as the model defines it, per token and head, float64: q = q_proj(q_c); c = RMSNorm(kv_a(h)[:L]),
    k_pe = rope(kv_a(h)[L:]); k_nope, v = kv_b(c) per head; token t attends to its request's cached (c, k_pe)
    rows, then the new tokens from first_new up to itself. contexts[t] = (cached c, cached k_pe, first_new)."""
    q = (q_c.double() @ impl.q_proj.weight.double().t()).view(-1, HEADS, NOPE + ROPE)
    kv = hidden.double() @ impl.kv_a_proj_with_mqa.weight.double().t()
    c = ref_rms_norm(kv[:, :KV_LORA], impl.kv_a_layernorm.weight, 1e-6)
    k_pe = torch.stack([ref_rope_at(kv[t, KV_LORA:], p) for t, p in enumerate(positions)])
    w_kv_b = impl.kv_b_proj.weight.double().view(HEADS, NOPE + V_DIM, KV_LORA)
    outs = []
    for t, (ctx_c, ctx_pe, first_new) in enumerate(contexts):
        cs = torch.cat((ctx_c.double(), c[first_new : t + 1]))
        pes = torch.cat((ctx_pe.double(), k_pe[first_new : t + 1]))
        heads = []
        for h in range(HEADS):
            k_nope, v = cs @ w_kv_b[h, :NOPE].t(), cs @ w_kv_b[h, NOPE:].t()
            scores = impl.scale * (k_nope @ q[t, h, :NOPE] + pes @ ref_rope_at(q[t, h, NOPE:], positions[t]))
            heads.append(torch.softmax(scores, 0) @ v)
        outs.append(torch.cat(heads))
    return torch.stack(outs) @ impl.o_proj.weight.double().t(), c, k_pe


def cached_rows(cache, table_row, length):
    return ref_gather(cache, table_row, length)[:, 0]


def assert_cache_rows(kv_cache, slots, c, k_pe, dtype):
    for i, s in enumerate(slots):
        close(kv_cache[0][s // BLOCK, s % BLOCK, 0], c[i], dtype)
        close(kv_cache[1][s // BLOCK, s % BLOCK, 0], k_pe[i], dtype)


@pytest.mark.needs_components("vllm", "vllm_ascend")
@pytest.mark.parametrize(
    "dtype, compiled, multistream",
    [(torch.float32, False, True), (torch.float32, True, False), (torch.bfloat16, False, True)],
)
def test_ascend_mla_torchair_decode_matches_plain_mla(mla_v1, dtype, compiled, multistream):
    """AscendMLAImpl.forward in its TorchAir branch (DecodeOnly, a padded batch entry as TorchAir pads):
    npu_prefetch, npu_kv_rmsnorm_rope_cache (PA), npu_interleave_rope, npu_fused_infer_attention_score (BNSD)."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionState  # lazy: needs vLLM imported

    impl = make_mla_impl(mla_v1, dtype)
    cos_cached, sin_cached, _ = deepseek_rope_tables(dtype)
    nope_cache, rope_cache = (
        rand(12, BLOCK, 1, KV_LORA, dtype=dtype, seed=10),
        rand(12, BLOCK, 1, ROPE, dtype=dtype, seed=11),
    )
    seq_lens, table = [6, 3, 9], torch.tensor([[3, 7, 0], [5, 0, 0], [1, 9, 2]], dtype=torch.int32)
    positions = [s - 1 for s in seq_lens]
    slots = [int(table[b, p // BLOCK]) * BLOCK + p % BLOCK for b, p in enumerate(positions)]
    q_c, hidden = rand(4, Q_LORA, dtype=dtype, seed=12), rand(4, HID, dtype=dtype, seed=13)  # 3 + 1 padding
    contexts = [
        (cached_rows(nope_cache, table[b], p), cached_rows(rope_cache, table[b], p), b) for b, p in enumerate(positions)
    ]
    expected, c_new, k_pe_new = ref_plain_mla(impl, q_c[:3], hidden[:3], positions, contexts)

    pos = torch.tensor(positions + [0])
    table_padded = torch.cat((table, torch.zeros(1, 3, dtype=torch.int32)))
    decode = mla_v1.AscendMLADecodeMetadata(
        input_positions=pos,
        block_table=table_padded,
        seq_lens=torch.tensor(seq_lens + [0]),
        max_seq_lens=9,
        seq_lens_list=seq_lens + [0],
        actual_seq_lengths_q=[1, 2, 3, 4],
        attn_mask=None,
        sin=sin_cached[pos][:, None, None],
        cos=cos_cached[pos][:, None, None],
    )
    meta = mla_v1.AscendMLAMetadata(
        num_actual_tokens=4,
        slot_mapping=torch.tensor(slots + [-1]),
        query_start_loc=torch.arange(5),
        seq_lens=decode.seq_lens,
        block_tables=table_padded,
        num_decodes=4,
        num_decode_tokens=4,
        num_prefills=0,
        attn_state=AscendAttentionState.DecodeOnly,
        decode=decode,
        prefill=None,
    )
    kv_cache = (nope_cache.clone(), rope_cache.clone())
    forward = torch.compile(impl.forward, dynamic=True, fullgraph=True, backend="eager") if compiled else impl.forward
    out = forward(
        None,
        q_c,
        hidden,
        None,
        kv_cache,
        meta,
        output=torch.empty(4, HID, dtype=dtype),
        enable_multistream_mla=multistream,
    )
    close(out[:3], expected, dtype, tol=1e-5)
    assert_cache_rows(kv_cache, slots, c_new, k_pe_new, dtype)
    untouched = [s for s in range(12 * BLOCK) if s not in slots]
    assert all(torch.equal(kv_cache[0][s // BLOCK, s % BLOCK], nope_cache[s // BLOCK, s % BLOCK]) for s in untouched)


@pytest.mark.needs_components("vllm", "vllm_ascend")
def test_ascend_mla_chunked_prefill_with_context_and_a_decode_matches_plain_mla(mla_v1):
    """AscendMLAImpl.forward with TorchAir on, ChunkedPrefill state (eager): a decode request (rotary embedding,
    _npu_reshape_and_cache, _npu_paged_attention_mla) and two prefills, one with 5 context tokens read back in two
    chunks (npu_paged_cache_load, npu_ring_mla first ring + merges), after npu_interleave_rope and
    npu_kv_rmsnorm_rope_cache (PA, is_output_kv) on the new tokens."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionState  # lazy: needs vLLM imported

    dtype = torch.float32
    impl = make_mla_impl(mla_v1, dtype)
    cos_cached, sin_cached, _ = deepseek_rope_tables(dtype)
    nope_cache, rope_cache = rand(16, BLOCK, 1, KV_LORA, seed=20), rand(16, BLOCK, 1, ROPE, seed=21)
    ctx, new = [6, 5, 0], [1, 3, 2]  # request 0 decodes
    table = torch.tensor([[3, 7, 0], [5, 11, 4], [1, 9, 2]], dtype=torch.int32)
    owners = [r for r in range(3) for _ in range(new[r])]
    positions = [ctx[r] + i for r in range(3) for i in range(new[r])]
    slots = [int(table[r, p // BLOCK]) * BLOCK + p % BLOCK for r, p in zip(owners, positions)]
    q_c, hidden = rand(6, Q_LORA, seed=22), rand(6, HID, seed=23)
    contexts = [
        (cached_rows(nope_cache, table[r], ctx[r]), cached_rows(rope_cache, table[r], ctx[r]), owners.index(r))
        for r in owners
    ]
    expected, c_new, k_pe_new = ref_plain_mla(impl, q_c, hidden, positions, contexts)

    pos = torch.tensor(positions)
    decode = mla_v1.AscendMLADecodeMetadata(
        input_positions=pos[:1],
        block_table=table[:1],
        seq_lens=torch.tensor([7]),
        max_seq_lens=7,
        seq_lens_list=[7],
        actual_seq_lengths_q=[1],
        attn_mask=None,
        sin=sin_cached[pos[:1]][:, None, None],
        cos=cos_cached[pos[:1]][:, None, None],
    )
    chunk_lens = torch.tensor([[4, 0], [1, 0]], dtype=torch.int32)  # chunks of 4 context tokens: [0, 4), [4, 5)
    chunked = mla_v1.AscendMLAPrefillMetadata.ChunkedContextMetadata(
        cu_seq_lens=torch.cat((torch.zeros(2, 1, dtype=torch.int32), chunk_lens.cumsum(1, dtype=torch.int32)), 1),
        starts=torch.tensor([[0, 0], [4, 4]], dtype=torch.int32),
        seq_tot=[4, 1],
        max_seq_lens=[4, 1],
        workspace=torch.empty(16, KV_LORA + ROPE),
        chunk_seq_lens=chunk_lens,
        chunk_seq_lens_npu=chunk_lens,
    )
    prefill = mla_v1.AscendMLAPrefillMetadata(
        attn_mask=torch.ones(512, 512).triu(1),
        query_lens=[3, 2],
        seq_lens=torch.tensor([8, 2]),
        context_lens=torch.tensor([5, 0]),
        input_positions=pos[1:],
        query_start_loc=torch.tensor([0, 3, 5]),
        block_table=table[1:],
        max_query_len=3,
        max_seq_lens=8,
        chunked_context=chunked,
        sin=sin_cached[pos[1:]][:, None, None],
        cos=cos_cached[pos[1:]][:, None, None],
    )
    meta = mla_v1.AscendMLAMetadata(
        num_actual_tokens=6,
        slot_mapping=torch.tensor(slots),
        query_start_loc=torch.tensor([0, 1, 4, 6]),
        seq_lens=torch.tensor([7, 8, 2]),
        block_tables=table,
        num_decodes=1,
        num_decode_tokens=1,
        num_prefills=2,
        attn_state=AscendAttentionState.ChunkedPrefill,
        decode=decode,
        prefill=prefill,
    )
    kv_cache = (nope_cache.clone(), rope_cache.clone())
    out = impl.forward(
        None, q_c, hidden, None, kv_cache, meta, output=torch.empty(6, HID), enable_multistream_mla=False
    )
    close(out, expected, dtype)
    assert_cache_rows(kv_cache, slots, c_new, k_pe_new, dtype)
