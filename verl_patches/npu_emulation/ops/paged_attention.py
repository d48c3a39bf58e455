"""The ATB attention kernels of vllm-ascend's V1 attention backend for models without MLA
(attention_v1.AscendAttentionBackendImpl: Qwen2, OPT, ...), in plain torch.

torch_npu._npu_flash_attention             prefill without cache: each sequence's tokens attend to one another
torch_npu._npu_flash_attention_qlens       prefill with a cache hit: new tokens attend to their sequence's paged keys
torch_npu._npu_paged_attention             decode: one token per sequence attends to its paged keys
torch_npu._npu_paged_attention_splitfuse   chunked prefill: each query token attends to its sequence's paged keys

One formula: out = softmax(scale * q k^T, blocked) v per query head, key/value head n // (N / Nkv), computed in
float32 for half-precision inputs and written into `out` (the kernels return nothing). Tokens are packed
sequence after sequence (query [T, N, D], T = sum of query lengths); a paged cache is (num_blocks, block_size, Nkv, D),
sequence b's token p at block_table[b, p // block_size], row p % block_size.

Masks are vllm-ascend's (attention.AttentionMaskBuilder): 0 where a key is attended, a nonzero value where it is not
(float32's minimum for float16, 1 for bfloat16, times -10000 for the splitfuse mask): every nonzero entry blocks its
key. `_npu_flash_attention` takes the [S, S] causal mask (sequence b uses its top-left [L_b, L_b]); the splitfuse
kernel one row per query token ([T, max_len], indexed by key position); `_npu_flash_attention_qlens` takes the
compressed causal tile (vllm-ascend passes 128 x 128) and aligns it to each sequence's end: query i of a sequence
with q_len new and kv_len total tokens sees keys 0 .. kv_len - q_len + i.

A3's job does not run these: DeepSeek's MLA has its own kernels (mla.py). They exist for vllm-ascend's own engine
tests on small models of other architectures.
"""

from __future__ import annotations

import torch

from verl_patches.npu_emulation.ops.mla import attend


def _lengths(x: torch.Tensor, what: str, op: str) -> torch.Tensor:
    lens = x.to("cpu", torch.long).reshape(-1)
    if (lens < 0).any():
        raise ValueError(f"{op}: {what} {lens.tolist()} must not be negative")
    return lens


def _heads(query: torch.Tensor, num_heads: int, num_kv_heads: int, op: str) -> tuple[int, int]:
    if query.dim() != 3 or query.shape[1] != num_heads:
        raise ValueError(f"{op}: query must be [tokens, num_heads={num_heads}, head_size], got {tuple(query.shape)}")
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"{op}: num_heads {num_heads} must be a multiple of num_kv_heads {num_kv_heads}")
    return query.shape[0], query.shape[2]


def _out_rows(out: torch.Tensor, rows: int, num_heads: int, dim: int, op: str) -> torch.Tensor:
    if out.numel() < rows * num_heads * dim or out.shape[0] < rows:
        raise ValueError(f"{op}: out {tuple(out.shape)} cannot hold {rows} tokens of {num_heads} x {dim}")
    return out.view(out.shape[0], num_heads, dim)


def _paged_keys(cache: torch.Tensor, table_row: torch.Tensor, length: int, num_kv_heads: int, op: str) -> torch.Tensor:
    """The first `length` tokens of one sequence from a (num_blocks, block_size, Nkv, D) cache: [length, Nkv, D]."""
    if cache.dim() != 4 or cache.shape[2] != num_kv_heads:
        raise ValueError(
            f"{op}: a paged cache must be (num_blocks, block_size, num_kv_heads={num_kv_heads}, head_size), got "
            f"{tuple(cache.shape)}"
        )
    block_size = cache.shape[1]
    blocks = -(-length // block_size)
    if blocks > table_row.numel():
        raise ValueError(
            f"{op}: a sequence of {length} tokens needs {blocks} blocks, its block table has {table_row.numel()}"
        )
    return cache[table_row[:blocks].long()].reshape(blocks * block_size, num_kv_heads, cache.shape[3])[:length]


def _attend_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocked: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Sq, N, D], k/v [Skv, Nkv, D], blocked [Sq, Skv] (True = not attended) -> [Sq, N, Dv] in the work dtype."""
    out, _ = attend(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), blocked.view(1, 1, *blocked.shape), scale)
    return out.squeeze(0)


def npu_flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    seq_len: torch.Tensor,
    scale_value: float,
    num_heads: int,
    num_kv_heads: int,
    out: torch.Tensor,
) -> None:
    """torch_npu._npu_flash_attention: sequence b's tokens (seq_len[b] of them, packed) attend to one another under
    the top-left [L, L] of `mask`."""
    op = "_npu_flash_attention"
    tokens, dim = _heads(query, num_heads, num_kv_heads, op)
    lens = _lengths(seq_len, "seq_len", op)
    if int(lens.sum()) > tokens or key.shape[:2] != value.shape[:2] or key.shape[1] != num_kv_heads:
        raise ValueError(
            f"{op}: seq_len {lens.tolist()} must fit the {tokens} query tokens; key {tuple(key.shape)} and value "
            f"{tuple(value.shape)} must be [tokens, num_kv_heads={num_kv_heads}, head_size]"
        )
    longest = int(lens.max()) if lens.numel() else 0
    if mask.dim() != 2 or mask.shape[0] < longest or mask.shape[1] < longest:
        raise ValueError(f"{op}: mask must be [S, S] with S >= the longest sequence {longest}, got {tuple(mask.shape)}")
    result = _out_rows(out, tokens, num_heads, value.shape[-1], op)
    start = 0
    for length in lens.tolist():
        rows = slice(start, start + length)
        blocked = mask[:length, :length] != 0
        result[rows] = _attend_one(query[rows], key[rows], value[rows], blocked, scale_value).to(out.dtype)
        start += length


def npu_flash_attention_qlens(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    mask: torch.Tensor,
    seq_len: torch.Tensor,
    context_lens: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    out: torch.Tensor,
) -> None:
    """torch_npu._npu_flash_attention_qlens: sequence b's seq_len[b] new tokens (packed in query) attend causally to
    the first context_lens[b] tokens of its paged cache, the new tokens being its last ones."""
    op = "_npu_flash_attention_qlens"
    tokens, dim = _heads(query, num_heads, num_kv_heads, op)
    q_lens, kv_lens = _lengths(seq_len, "seq_len", op), _lengths(context_lens, "context_lens", op)
    if q_lens.numel() != kv_lens.numel() or (q_lens > kv_lens).any() or int(q_lens.sum()) > tokens:
        raise ValueError(
            f"{op}: seq_len {q_lens.tolist()} (new tokens) and context_lens {kv_lens.tolist()} (all tokens) must give "
            f"one pair per sequence, new <= all, fitting the {tokens} query tokens"
        )
    if block_table.dim() != 2 or block_table.shape[0] < q_lens.numel():
        raise ValueError(f"{op}: block_table {tuple(block_table.shape)} needs a row per sequence")
    tile = mask.shape[0] if mask.dim() == 2 and mask.shape[0] == mask.shape[1] else 0
    causal = torch.ones(tile, tile, dtype=torch.bool, device=mask.device).triu(1)
    if not tile or not torch.equal(mask != 0, causal):
        raise ValueError(
            f"{op}: mask must be the square causal tile (nonzero above the diagonal), got {tuple(mask.shape)}"
        )
    result = _out_rows(out, tokens, num_heads, value_cache.shape[-1], op)
    start = 0
    for b, (q_len, kv_len) in enumerate(zip(q_lens.tolist(), kv_lens.tolist())):
        k = _paged_keys(key_cache, block_table[b], kv_len, num_kv_heads, op)
        v = _paged_keys(value_cache, block_table[b], kv_len, num_kv_heads, op)
        i = torch.arange(q_len, device=query.device).view(-1, 1)
        j = torch.arange(kv_len, device=query.device).view(1, -1)
        rows = slice(start, start + q_len)
        result[rows] = _attend_one(query[rows], k, v, j > i + (kv_len - q_len), scale_value).to(out.dtype)
        start += q_len


def npu_paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """torch_npu._npu_paged_attention: query row b (one token of sequence b) attends to the first context_lens[b]
    tokens of its paged cache."""
    op = "_npu_paged_attention"
    tokens, dim = _heads(query, num_heads, num_kv_heads, op)
    kv_lens = _lengths(context_lens, "context_lens", op)
    batch = kv_lens.numel()
    if batch > tokens or block_table.dim() != 2 or block_table.shape[0] < batch:
        raise ValueError(
            f"{op}: context_lens {kv_lens.tolist()} needs one query row and one block_table row per sequence, got "
            f"query {tuple(query.shape)}, block_table {tuple(block_table.shape)}"
        )
    result = _out_rows(out, batch, num_heads, value_cache.shape[-1], op)
    for b, kv_len in enumerate(kv_lens.tolist()):
        k = _paged_keys(key_cache, block_table[b], kv_len, num_kv_heads, op)
        v = _paged_keys(value_cache, block_table[b], kv_len, num_kv_heads, op)
        blocked = torch.zeros(1, kv_len, dtype=torch.bool, device=query.device)
        result[b : b + 1] = _attend_one(query[b : b + 1], k, v, blocked, scale_value).to(out.dtype)


def npu_paged_attention_splitfuse(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    mask: torch.Tensor,
    seq_len: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    out: torch.Tensor,
) -> None:
    """torch_npu._npu_paged_attention_splitfuse: sequence b's seq_len[b] query tokens (packed) attend to the first
    context_lens[b] tokens of its paged cache; query token t sees key position j where mask[t, j] == 0."""
    op = "_npu_paged_attention_splitfuse"
    tokens, dim = _heads(query, num_heads, num_kv_heads, op)
    q_lens, kv_lens = _lengths(seq_len, "seq_len", op), _lengths(context_lens, "context_lens", op)
    total = int(q_lens.sum())
    if q_lens.numel() != kv_lens.numel() or (q_lens > kv_lens).any() or total > tokens:
        raise ValueError(
            f"{op}: seq_len {q_lens.tolist()} (query tokens) and context_lens {kv_lens.tolist()} (all tokens) must "
            f"give one pair per sequence, query <= all, fitting the {tokens} query tokens"
        )
    longest = int(kv_lens.max()) if kv_lens.numel() else 0
    if mask.dim() != 2 or mask.shape[0] < total or mask.shape[1] < longest:
        raise ValueError(
            f"{op}: mask must be [query tokens >= {total}, keys >= {longest}] (one row per query token), got "
            f"{tuple(mask.shape)}"
        )
    if block_table.dim() != 2 or block_table.shape[0] < q_lens.numel():
        raise ValueError(f"{op}: block_table {tuple(block_table.shape)} needs a row per sequence")
    result = _out_rows(out, tokens, num_heads, value_cache.shape[-1], op)
    start = 0
    for b, (q_len, kv_len) in enumerate(zip(q_lens.tolist(), kv_lens.tolist())):
        k = _paged_keys(key_cache, block_table[b], kv_len, num_kv_heads, op)
        v = _paged_keys(value_cache, block_table[b], kv_len, num_kv_heads, op)
        rows = slice(start, start + q_len)
        result[rows] = _attend_one(query[rows], k, v, mask[rows, :kv_len] != 0, scale_value).to(out.dtype)
        start += q_len
