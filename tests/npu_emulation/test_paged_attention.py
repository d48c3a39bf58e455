"""vllm-ascend's attention kernels for models without MLA (prefill, prefill with a cache hit, decode, chunked prefill),
emulated: each against a naive reference (a loop over sequences, query tokens and heads, in float64), with masks
built by vllm-ascend's conventions for float16 and bfloat16 (attention.AttentionMaskBuilder), and the int32 index
the npu device's gather accepts as torch_npu's does."""

from __future__ import annotations

import pytest
import torch

from verl_patches.npu_emulation.ops import paged_attention as pa

BLOCK = 4
HEADS, KV_HEADS, DIM = 4, 2, 8
SCALE = DIM**-0.5


@pytest.fixture(autouse=True)
def _emulation(torch_npu):
    return torch_npu


def _attention(q, keys, values, visible):
    """One query token [N, D] over keys/values [S, Nkv, D] where visible[j]: float64, GQA head n -> n // (N/Nkv)."""
    out = torch.zeros(q.shape[0], values.shape[-1], dtype=torch.float64)
    group = q.shape[0] // keys.shape[1]
    for n in range(q.shape[0]):
        js = [j for j in range(keys.shape[0]) if visible[j]]
        scores = torch.stack([SCALE * (q[n].double() @ keys[j, n // group].double()) for j in js])
        probs = torch.softmax(scores, 0)
        out[n] = sum(p * values[j, n // group].double() for p, j in zip(probs, js))
    return out


def _mask(length, dtype, positions=None):
    """Causal masks as vllm-ascend builds them (attention.generate_attn_mask / get_splitfuse_attn_mask): 0 where a key
    is attended; float32's minimum for float16, 1 for bfloat16 where not; the splitfuse mask takes the rows at each
    query token's position and scales bfloat16's by -10000."""
    blocked = torch.ones(length, length, dtype=torch.bool).triu(1)
    value = torch.finfo(torch.float32).min if dtype == torch.float16 else 1.0
    mask = torch.zeros(length, length).masked_fill(blocked, value).to(dtype)
    if positions is None:
        return mask
    return mask.index_select(0, positions) * (-10000 if dtype == torch.bfloat16 else 1)


def _paged(seqs, dtype):
    """Each sequence's keys/values scattered into blocks (in reverse order, so the table matters)."""
    blocks_per = [-(-s.shape[0] // BLOCK) for s in seqs["k"]]
    total = sum(blocks_per)
    k_cache = torch.randn(total + 1, BLOCK, KV_HEADS, DIM).to(dtype)  # garbage where nothing is written
    v_cache = torch.randn(total + 1, BLOCK, KV_HEADS, DIM).to(dtype)
    table = torch.zeros(len(blocks_per), max(blocks_per), dtype=torch.int32)
    free = list(range(total, 0, -1))
    for b, (k, v) in enumerate(zip(seqs["k"], seqs["v"])):
        for i in range(blocks_per[b]):
            block = free.pop(0)
            table[b, i] = block
            rows = slice(i * BLOCK, min((i + 1) * BLOCK, k.shape[0]))
            k_cache[block, : rows.stop - rows.start] = k[rows]
            v_cache[block, : rows.stop - rows.start] = v[rows]
    return k_cache, v_cache, table


def _tol(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


def _close(got, want, dtype):
    assert float((got.double() - want).abs().max()) <= _tol(dtype) * max(1.0, float(want.abs().max()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attention_is_causal_attention_per_packed_sequence(dtype, torch_npu):
    torch.manual_seed(0)
    lens = [3, 6, 1]
    q = torch.randn(sum(lens) + 2, HEADS, DIM).to(dtype)  # two padding rows past the sequences
    k, v = torch.randn(sum(lens) + 2, KV_HEADS, DIM).to(dtype), torch.randn(sum(lens) + 2, KV_HEADS, DIM).to(dtype)
    out = torch.full((q.shape[0], HEADS * DIM), 7.0, dtype=dtype)
    torch_npu._npu_flash_attention(
        query=q,
        key=k,
        value=v,
        mask=_mask(max(lens), dtype),
        seq_len=torch.tensor(lens, dtype=torch.int32),
        scale_value=SCALE,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        out=out,
    )
    start = 0
    for length in lens:
        for i in range(length):
            t = start + i
            want = _attention(
                q[t], k[start : start + length], v[start : start + length], [j <= i for j in range(length)]
            )
            _close(out[t].view(HEADS, DIM), want, dtype)
        start += length
    assert torch.all(out[start:] == 7.0)  # rows past the sequences are not written


def _cache_case(dtype, q_lens, kv_lens, lens_dtype=torch.int32):
    """The new tokens' queries, the sequences' keys/values, and the arguments every cache-reading kernel takes
    (the keys/values paged, the block table, the sequences' lengths as ``lens_dtype``, the head counts)."""
    torch.manual_seed(1)
    seqs = {"k": [torch.randn(n, KV_HEADS, DIM).to(dtype) for n in kv_lens]}
    seqs["v"] = [torch.randn(n, KV_HEADS, DIM).to(dtype) for n in kv_lens]
    q = torch.randn(sum(q_lens), HEADS, DIM).to(dtype)
    k_cache, v_cache, table = _paged(seqs, dtype)
    over_cache = dict(
        query=q,
        key_cache=k_cache,
        value_cache=v_cache,
        block_table=table,
        context_lens=torch.tensor(kv_lens, dtype=lens_dtype),
        num_kv_heads=KV_HEADS,
        num_heads=HEADS,
        scale_value=SCALE,
    )
    return q, seqs, over_cache


def _check_new_tokens(out, q, seqs, q_lens, kv_lens, dtype):
    """Each sequence's q_len new tokens are its last ones: each attends causally to its cached sequence."""
    t = 0
    for b, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        for i in range(q_len):
            position = kv_len - q_len + i
            _close(out[t], _attention(q[t], seqs["k"][b], seqs["v"][b], [j <= position for j in range(kv_len)]), dtype)
            t += 1


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_flash_attention_qlens_attends_new_tokens_to_their_cached_sequence(dtype, torch_npu):
    q_lens, kv_lens = [2, 5], [7, 5]
    q, seqs, over_cache = _cache_case(dtype, q_lens, kv_lens)
    seq_len = torch.tensor(q_lens, dtype=torch.int32)
    out = torch.zeros(q.shape[0], HEADS, DIM, dtype=dtype)
    torch_npu._npu_flash_attention_qlens(**over_cache, mask=_mask(128, dtype), seq_len=seq_len, out=out)
    _check_new_tokens(out, q, seqs, q_lens, kv_lens, dtype)
    with pytest.raises((ValueError, RuntimeError), match="square causal tile"):
        torch_npu._npu_flash_attention_qlens(
            **over_cache, mask=torch.zeros(128, 128, dtype=dtype), seq_len=seq_len, out=out
        )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_decodes_one_token_per_sequence(dtype, torch_npu):
    kv_lens = [1, 9, 4]
    q, seqs, over_cache = _cache_case(dtype, [1, 1, 1], kv_lens)
    out = torch.zeros(3, HEADS, DIM, dtype=dtype)
    torch_npu._npu_paged_attention(**over_cache, out=out)
    for b, kv_len in enumerate(kv_lens):
        _close(out[b], _attention(q[b], seqs["k"][b], seqs["v"][b], [True] * kv_len), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_attention_splitfuse_uses_one_mask_row_per_query_token(dtype, torch_npu):
    """A chunked-prefill step: a decode (1 of 6 tokens), a middle chunk (3 of 8) and a first chunk (2 of 2), with the
    mask vllm-ascend builds for it."""
    q_lens, kv_lens = [1, 3, 2], [6, 8, 2]
    q, seqs, over_cache = _cache_case(dtype, q_lens, kv_lens, lens_dtype=torch.int64)
    positions = torch.tensor([p for ql, kl in zip(q_lens, kv_lens) for p in range(kl - ql, kl)])
    mask = _mask(max(kv_lens), dtype, positions)
    out = torch.zeros(q.shape[0], HEADS, DIM, dtype=dtype)
    torch_npu._npu_paged_attention_splitfuse(**over_cache, mask=mask, seq_len=torch.tensor(q_lens), out=out)
    _check_new_tokens(out, q, seqs, q_lens, kv_lens, dtype)


def test_the_kernels_refuse_inputs_that_do_not_fit():
    q = torch.zeros(3, HEADS, DIM)
    with pytest.raises(ValueError, match="must be a multiple of num_kv_heads"):
        pa.npu_paged_attention(
            q,
            torch.zeros(2, BLOCK, 3, DIM),
            torch.zeros(2, BLOCK, 3, DIM),
            3,
            HEADS,
            1.0,
            torch.zeros(3, 1, dtype=torch.int32),
            torch.ones(3, dtype=torch.int32),
            q.clone(),
        )
    with pytest.raises(ValueError, match="needs 2 blocks, its block table has 1"):
        pa.npu_paged_attention(
            q,
            torch.zeros(2, BLOCK, KV_HEADS, DIM),
            torch.zeros(2, BLOCK, KV_HEADS, DIM),
            KV_HEADS,
            HEADS,
            1.0,
            torch.zeros(3, 1, dtype=torch.int32),
            torch.full((3,), 5, dtype=torch.int32),
            q.clone(),
        )
    with pytest.raises(ValueError, match="mask must be \\[S, S\\]"):
        pa.npu_flash_attention(
            q, q[:, :KV_HEADS], q[:, :KV_HEADS], torch.zeros(2, 2), torch.tensor([3]), 1.0, HEADS, KV_HEADS, q.clone()
        )


def test_the_npu_device_gathers_with_an_int32_index_as_torch_npu_does():
    table = torch.arange(12, device="npu").view(3, 4)
    index = torch.tensor([[1], [0], [3]], dtype=torch.int32, device="npu")
    assert table.gather(1, index).cpu().tolist() == [[1], [4], [11]]
    out = torch.empty(3, 1, dtype=torch.long, device="npu")
    torch.gather(table, 1, index, out=out)
    assert out.cpu().tolist() == [[1], [4], [11]]
    with pytest.raises(RuntimeError, match="Expected dtype int64 for index"):  # the CPU keeps torch's rule
        torch.arange(4).gather(0, torch.tensor([1], dtype=torch.int32))
