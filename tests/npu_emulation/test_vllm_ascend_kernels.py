"""vllm-ascend's own compiled kernels (torch.ops._C) and torch_npu.npu_apply_rotary_pos_emb, emulated: each against an
independent reference of its kernel's formula, its binding's checks and its documented limits, and where it is
registered (torch.ops._C only while vllm-ascend's compiled extension is absent)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.npu_emulation.ops import apply_rotary_pos_emb as arpe
from verl_patches.npu_emulation.ops import vllm_ascend_c_registry as registry
from verl_patches.npu_emulation.ops import vllm_ascend_kernels as kernels


@pytest.fixture(autouse=True)
def _emulation(torch_npu):
    """The stand-in torch_npu (tests/npu_emulation/conftest.py): importing it registers torch.ops._C and torch_npu's
    ops."""
    return torch_npu


# ---- rotary_embedding -------------------------------------------------------------------------------------------
def _rope_reference(positions, x, head_size, cache):
    """Per token and head, element by element in float64: the neox rotation of the first rot_dim dims."""
    tokens = positions.numel()
    xs = x.reshape(tokens, -1, head_size).double()
    out = xs.clone()
    half = cache.shape[1] // 2
    for t in range(tokens):
        row = cache[positions.reshape(-1)[t]].double()
        for i in range(half):
            c, s = row[i], row[half + i]
            a, b = xs[t, :, i], xs[t, :, half + i]
            out[t, :, i], out[t, :, half + i] = a * c - b * s, a * s + b * c
    return out


def _cache(max_pos, rot_dim, dtype):
    inv = 1.0 / (10000 ** (torch.arange(0, rot_dim, 2, dtype=torch.float) / rot_dim))
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float), inv)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_size,rot_dim", [(64, 64), (96, 32), (128, 128)])
def test_rotary_embedding_is_the_neox_rotation_of_the_cached_angles(dtype, head_size, rot_dim):
    torch.manual_seed(0)
    positions = torch.randint(0, 50, (7,))
    qkv = torch.randn(7, 3 * 3 * head_size, dtype=dtype)
    query, key = qkv[:, : 3 * head_size], qkv[:, 3 * head_size : 4 * head_size]  # strided views, 3 and 1 heads
    cache = _cache(50, rot_dim, dtype)
    q_in, k_in = query.clone(), key.clone()
    q, k = torch.ops._C.rotary_embedding(positions, query, key, head_size, cache, True)
    assert q.shape == (7, 3, head_size) and k.shape == (7, 1, head_size) and q.dtype == dtype
    assert torch.equal(query, q_in) and torch.equal(key, k_in)  # the kernel only reads them
    ulp = 2.0**-10 if dtype == torch.float16 else 2.0**-7
    for got, x in ((q, query), (k, key)):
        ref = _rope_reference(positions, x, head_size, cache)
        assert torch.equal(got[..., rot_dim:], x.reshape(got.shape)[..., rot_dim:])
        err = (got.double() - ref).abs() / ref.abs().clamp_min(1.0)
        assert float(err.max()) <= 2 * ulp


def test_rotary_embedding_float16_is_computed_in_half_arithmetic():
    """The kernel's accumulator type for half is half (csrc/kernels/utils.h): bit for bit the float16 formula."""
    torch.manual_seed(1)
    positions = torch.randint(0, 64, (5,))
    query, key = torch.randn(5, 2 * 64, dtype=torch.float16), torch.randn(5, 64, dtype=torch.float16)
    cache = _cache(64, 64, torch.float16)
    q, _ = torch.ops._C.rotary_embedding(positions, query, key, 64, cache, True)
    cos, sin = cache[positions].chunk(2, dim=-1)
    x = query.view(5, 2, 64)
    x1, x2 = x[..., :32], x[..., 32:]
    expected = torch.cat((x1 * cos[:, None] - x2 * sin[:, None], x1 * sin[:, None] + x2 * cos[:, None]), dim=-1)
    assert torch.equal(q, expected)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, width=32))
def test_bfloat16_results_are_cast_toward_zero(value):
    got = float(kernels._round_toward_zero(torch.tensor([value], dtype=torch.float32), torch.bfloat16))
    assert abs(got) <= abs(value) and (got == 0.0 or math.copysign(1.0, got) == math.copysign(1.0, value))
    step = max(2.0 ** (math.frexp(got)[1] - 8), 2.0**-133)  # one bfloat16 step at |got| (subnormals: 2**-133)
    assert abs(value) - abs(got) < step  # the nearest bfloat16 toward zero, never one further


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(is_neox=False), "neox=false is not supported"),
        (dict(head_size=48), "divisible by 32"),
        (dict(dtype=torch.float32), "float16 and bfloat16 only"),
        (dict(head_size=512, width=512), "wider than the kernel's 512-byte load"),
        (dict(positions=torch.zeros(3, dtype=torch.int64)), "same number of tokens"),
        (dict(positions=torch.zeros(4, dtype=torch.int32)), "must be int64"),
    ],
)
def test_rotary_embedding_refuses_what_its_binding_refuses(change, message):
    dtype = change.get("dtype", torch.float16)
    head = change.get("head_size", 64)
    width = change.get("width", 64)
    positions = change.get("positions", torch.zeros(4, dtype=torch.int64))
    query, key = torch.zeros(4, width, dtype=dtype), torch.zeros(4, width, dtype=dtype)
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        torch.ops._C.rotary_embedding(positions, query, key, head, _cache(8, 32, dtype), change.get("is_neox", True))


# ---- get_masked_input_and_mask ----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.integers(0, 50),
    st.integers(0, 50),
    st.integers(0, 8),
    st.integers(0, 30),
    st.integers(0, 30),
    st.lists(st.integers(0, 200), min_size=1, max_size=12),
)
def test_get_masked_input_and_mask_makes_ids_shard_local(start, width, padding, gap, added, ids):
    end = start + width
    added_start = end + gap
    added_end = added_start + added
    x = torch.tensor(ids, dtype=torch.int32)
    masked, mask = torch.ops._C.get_masked_input_and_mask(x, start, end, padding, added_start, added_end)
    assert masked.dtype == torch.int32 and mask.dtype == torch.bool
    for i, token in enumerate(ids):
        if start <= token < end:
            assert (int(masked[i]), bool(mask[i])) == (token - start, False)
        elif added_start <= token < added_end:  # added tokens follow the padded base shard
            assert (int(masked[i]), bool(mask[i])) == (width + padding + token - added_start, False)
        else:
            assert (int(masked[i]), bool(mask[i])) == (0, True)


@pytest.mark.parametrize(
    "args, message",
    [
        ((torch.zeros(3, dtype=torch.int64), 0, 4, 0, 4, 4), "int32 token ids only"),
        ((torch.zeros(3, dtype=torch.int32), 5, 4, 0, 5, 5), "org_vocab_end_index must be greater"),
        ((torch.zeros(3, dtype=torch.int32), 0, 4, 0, 2, 8), "added_vocab_start_index must be greater"),
        ((torch.zeros(3, dtype=torch.int32), 0, 4, 0, 4, 1 << 24), "float32, exact below"),
    ],
)
def test_get_masked_input_and_mask_refuses_what_its_kernel_cannot_do(args, message):
    with pytest.raises((ValueError, TypeError, RuntimeError), match=message):
        torch.ops._C.get_masked_input_and_mask(*args)


# ---- advance_step_flashattn_ascendc -----------------------------------------------------------------------------
def test_advance_step_moves_each_query_one_token_on_in_place():
    block_size = 4
    tokens = torch.tensor([7, 8, 9], dtype=torch.int64)
    sampled = torch.tensor([[11], [12]], dtype=torch.int64)
    positions = torch.tensor([0, 0, 0], dtype=torch.int64)
    seq_lens = torch.tensor([3, 8, 5], dtype=torch.int32)
    slots = torch.tensor([-1, -1, -1], dtype=torch.int32)
    tables = torch.tensor([[5, 6, 7], [1, 2, 3], [9, 9, 9]], dtype=torch.int32)
    torch.ops._C.advance_step_flashattn_ascendc(3, 2, block_size, tokens, sampled, positions, seq_lens, slots, tables)
    assert tokens.tolist() == [11, 12, 9]  # only the first num_queries sequences move
    assert positions.tolist() == [3, 8, 0]  # the new token's position is the old length
    assert seq_lens.tolist() == [4, 9, 5]
    assert slots.tolist() == [5 * 4 + 3, 3 * 4 + 0, -1]  # block p // 4 of the sequence's table, row p % 4


def test_advance_step_refuses_tensors_its_binding_refuses():
    args = [torch.zeros(2, dtype=torch.int64), torch.zeros(2, 1, dtype=torch.int64), torch.zeros(2, dtype=torch.int64)]
    args += [torch.zeros(2, dtype=torch.int64), torch.zeros(2, dtype=torch.int32), torch.zeros(2, 1, dtype=torch.int32)]
    with pytest.raises((ValueError, RuntimeError), match="name = seq_lens"):  # seq_lens must be int32
        torch.ops._C.advance_step_flashattn_ascendc(2, 2, 16, *args)


# ---- registration ------------------------------------------------------------------------------------------------
def test_the_c_ops_carry_the_bindings_schemas_and_work_on_npu_tensors():
    for name, (schema, _, _) in registry.OPS.items():
        assert str(getattr(torch.ops._C, name).default._schema) == str(torch._C.parse_schema(f"_C::{schema}")), name
    x = torch.tensor([1, 150, 350, 999], dtype=torch.int32, device="npu")
    masked, mask = torch.ops._C.get_masked_input_and_mask(x, 100, 200, 0, 300, 400)
    assert (
        masked.device.type == "npu"
        and masked.cpu().tolist() == [0, 50, 150, 0]
        and mask.cpu().tolist()
        == [
            True,
            False,
            False,
            True,
        ]
    )


def test_registration_is_refused_where_the_compiled_kernels_exist(monkeypatch):
    assert registry.compiled_extension_location() is None  # no vllm_ascend_C on this host
    monkeypatch.setitem(
        registry.OPS, "verl_patches_probe_op", ("verl_patches_probe_op(Tensor x) -> Tensor", None, None)
    )
    monkeypatch.setattr(registry, "compiled_extension_location", lambda: "/site/vllm_ascend/vllm_ascend_C.so")
    with pytest.raises(registry.CompiledKernelsPresent, match="vllm_ascend_C.so"):
        registry.register_vllm_ascend_c_ops()


# ---- torch_npu.npu_apply_rotary_pos_emb ---------------------------------------------------------------------------
def _apply_reference(x, cos, sin):
    x64 = x.double()
    half = x.shape[-1] // 2
    rotated = torch.cat((-x64[..., half:], x64[..., :half]), dim=-1)
    return x64 * cos.double() + rotated * sin.double()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_apply_rotary_pos_emb_rotates_query_and_key_in_place(dtype, torch_npu):
    torch.manual_seed(2)
    qk = torch.randn(2, 5, 4, 3 * 64, dtype=dtype)
    query, key = qk[..., :64], qk[..., 64:128][:, :, :2]  # strided views of one buffer, 4 and 2 heads
    angles = torch.rand(2, 5, 1, 32) * 6
    cos, sin = (
        torch.cat((angles.cos(), angles.cos()), -1).to(dtype),
        torch.cat((angles.sin(), angles.sin()), -1).to(dtype),
    )
    want_q, want_k = _apply_reference(query, cos, sin), _apply_reference(key, cos, sin)
    rest = qk[..., 128:].clone()
    out_q, out_k = torch_npu.npu_apply_rotary_pos_emb(query, key, cos, sin)
    tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-6}[dtype]
    for got, want in ((query, want_q), (key, want_k)):
        assert float(((got.double() - want).abs() / want.abs().clamp_min(1.0)).max()) <= tol
    assert torch.equal(out_q, query) and torch.equal(out_k, key)  # the results, returned as copies
    assert torch.equal(qk[..., 128:], rest)  # nothing outside the views is written


def test_apply_rotary_pos_emb_float16_is_half_arithmetic():
    query, key = torch.randn(1, 3, 2, 16, dtype=torch.float16), torch.randn(1, 3, 1, 16, dtype=torch.float16)
    cos, sin = torch.rand(1, 3, 1, 16, dtype=torch.float16), torch.rand(1, 3, 1, 16, dtype=torch.float16)
    expected = query * cos + torch.cat((-query[..., 8:], query[..., :8]), -1) * sin
    arpe.npu_apply_rotary_pos_emb(query, key, cos, sin)
    assert torch.equal(query, expected)


@pytest.mark.parametrize(
    "query, key, cos, layout, message",
    [
        ((1, 3, 2, 16), (1, 3, 1, 16), (1, 3, 1, 16), "BNSD", "layout 'BNSD' is not supported"),
        ((3, 2, 16), (1, 3, 1, 16), (1, 3, 1, 16), "BSH", "query must be 4-D"),
        ((1, 3, 2, 16), (1, 4, 1, 16), (1, 3, 1, 16), "BSH", "must match query .* in B, S and D"),
        ((1, 3, 2, 16), (1, 3, 1, 16), (1, 3, 2, 16), "BSH", "cos must be \\[B, S, 1, D\\]"),
        ((1, 3, 2, 15), (1, 3, 1, 15), (1, 3, 1, 15), "BSH", "must be even"),
    ],
)
def test_apply_rotary_pos_emb_refuses_what_the_kernel_refuses(query, key, cos, layout, message, torch_npu):
    args = [torch.zeros(query), torch.zeros(key), torch.zeros(cos), torch.zeros(cos)]
    with pytest.raises((ValueError, RuntimeError), match=message):
        torch_npu.npu_apply_rotary_pos_emb(*args, layout)
    with pytest.raises((TypeError, RuntimeError), match="share one dtype"):
        torch_npu.npu_apply_rotary_pos_emb(
            torch.zeros(1, 3, 2, 16),
            torch.zeros(1, 3, 1, 16),
            torch.zeros(1, 3, 1, 16, dtype=torch.float16),
            torch.zeros(1, 3, 1, 16),
        )
