"""Plain-torch versions of vllm-ascend's own compiled kernels (`vllm_ascend_C`, csrc/ of the pinned sdist).

vllm-ascend 0.9.1 builds three AscendC kernels into `torch.ops._C` (csrc/torch_binding.cpp): `rotary_embedding`,
`get_masked_input_and_mask` and `advance_step_flashattn_ascendc`. Each function here computes what its kernel
computes, with the checks its binding makes (TORCH_CHECK, verify_tensor) and the limits its kernel has, each
refused with the reason; `vllm_ascend_c_registry` registers them on a CPU host.

Whether A3's job calls them (its vllm_ascend_C is built, so `enable_custom_op()` is True there): `rotary_embedding`
only for float16 queries (rope_forward_oot), and A3 runs bfloat16; `advance_step_flashattn_ascendc` only from the V0
multi-step runner (attention/attention.py), and A3 runs the V1 engine; `get_masked_input_and_mask` never (vllm-ascend's
VocabParallelEmbedding computes the mask in Python). They exist here for vllm-ascend's own tests of them.
"""

from __future__ import annotations

import torch

# rotary_embedding: the kernel moves one 512-byte chunk of heads per step (csrc/kernels/pos_encoding_kernels.cpp,
# loadSize); a head wider than a chunk gives zero heads per step (a division by zero in the kernel's loop counts).
_ROPE_LOAD_BYTES = 512
_ROPE_DTYPES = (torch.float16, torch.bfloat16)
# get_masked_input_and_mask: the kernel compares ids as float32, exact below 2**24.
_FP32_EXACT_INTS = 1 << 24


def _dense_token_rows(x: torch.Tensor, name: str, num_tokens: int, token_dim: int) -> torch.Tensor:
    """`x` as [num_tokens, hidden]: the kernel steps from token to token by x.stride(token_dim) and reads each token's
    hidden elements as one dense run, so they must be dense."""
    inner = x.shape[token_dim + 1 :]
    expected = 1
    for size, stride in zip(reversed(inner), reversed(x.stride()[token_dim + 1 :])):
        if size != 1 and stride != expected:
            raise ValueError(
                f"rotary_embedding: {name}'s elements within a token must be dense (the kernel reads each token's "
                f"heads as one run), got sizes {tuple(x.shape)} strides {x.stride()}"
            )
        expected *= size
    return x.reshape(num_tokens, -1)


def _round_toward_zero(exact: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 -> bfloat16 with the kernel's CAST_TRUNC (toward zero; NaN stays NaN)."""
    assert dtype == torch.bfloat16
    truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(dtype)  # exact: low bits are zero
    return torch.where(torch.isnan(exact), exact.to(dtype), truncated)


def rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPT-NeoX rotary embedding into new tensors [tokens, heads, head_size] (query and key are only read).

    For each token t and head h, with c = cos_sin_cache[positions[t]], half = rot_dim // 2 (rot_dim =
    cos_sin_cache.size(1)), x1 = x[:half], x2 = x[half:rot_dim]:
    out[:half] = x1*cos - x2*sin, out[half:rot_dim] = x1*sin + x2*cos, out[rot_dim:] = x[rot_dim:].
    float16 computes in float16 (the kernel's accumulator type for half); bfloat16 in float32, cast toward zero.
    """
    if positions.dim() not in (1, 2):
        raise ValueError("rotary_embedding: positions must have shape [num_tokens] or [batch_size, seq_len]")
    if positions.dtype != torch.int64:
        raise TypeError(
            f"rotary_embedding: positions must be int64 (the kernel reads int64 ids), got {positions.dtype}"
        )
    lead = tuple(positions.shape)
    if tuple(query.shape[: len(lead)]) != lead or tuple(key.shape[: len(lead)]) != lead:
        raise ValueError(
            "rotary_embedding: query, key and positions must have the same number of tokens"
            + (" (and the same batch_size and seq_len)" if len(lead) == 2 else "")
            + f": positions {lead}, query {tuple(query.shape)}, key {tuple(key.shape)}"
        )
    if head_size % 32 != 0:
        raise ValueError(f"rotary_embedding: headSize should be divisible by 32, got {head_size}")
    if not is_neox:
        raise ValueError("rotary_embedding: neox=false is not supported as custom kernel in vllm-ascend")
    num_tokens = positions.numel()
    if query.dtype not in _ROPE_DTYPES or key.dtype != query.dtype or cos_sin_cache.dtype != query.dtype:
        raise TypeError(
            "rotary_embedding: the kernel is built for float16 and bfloat16 only, with key and cos_sin_cache of the "
            f"query's dtype (for any other dtype it writes nothing and returns uninitialised tensors); got query "
            f"{query.dtype}, key {key.dtype}, cos_sin_cache {cos_sin_cache.dtype}"
        )
    if head_size * query.element_size() > _ROPE_LOAD_BYTES:
        raise ValueError(
            f"rotary_embedding: head_size {head_size} of {query.dtype} is wider than the kernel's "
            f"{_ROPE_LOAD_BYTES}-byte load ({_ROPE_LOAD_BYTES // query.element_size()} elements at most)"
        )
    q = _dense_token_rows(query, "query", num_tokens, positions.dim() - 1)
    k = _dense_token_rows(key, "key", num_tokens, positions.dim() - 1)
    if num_tokens and (q.shape[1] % head_size or k.shape[1] % head_size):
        raise ValueError(
            f"rotary_embedding: query hidden {q.shape[1]} and key hidden {k.shape[1]} must be multiples of "
            f"head_size {head_size}"
        )
    num_heads, num_kv_heads = (q.shape[1] // head_size, k.shape[1] // head_size) if num_tokens else (0, 0)
    if num_kv_heads and num_heads % num_kv_heads:
        raise ValueError(f"rotary_embedding: {num_heads} query heads are not a multiple of {num_kv_heads} key heads")
    rot_dim = cos_sin_cache.size(1)
    if rot_dim % 2 or rot_dim > head_size:
        raise ValueError(f"rotary_embedding: cos_sin_cache width {rot_dim} must be even and at most head_size")
    half = rot_dim // 2
    cache = cos_sin_cache.index_select(0, positions.reshape(-1)).unsqueeze(1)  # [T, 1, rot_dim]
    work = torch.float16 if query.dtype == torch.float16 else torch.float32
    cos, sin = cache[..., :half].to(work), cache[..., half:rot_dim].to(work)

    def rotate(rows: torch.Tensor, heads: int) -> torch.Tensor:
        x = rows.reshape(num_tokens, heads, head_size)
        x1, x2 = x[..., :half].to(work), x[..., half:rot_dim].to(work)
        rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        if work != x.dtype:
            rotated = _round_toward_zero(rotated, x.dtype)
        return torch.cat((rotated, x[..., rot_dim:]), dim=-1)

    return rotate(q, num_heads), rotate(k, num_kv_heads)


def get_masked_input_and_mask(
    input: torch.Tensor,
    org_vocab_start_index: int,
    org_vocab_end_index: int,
    num_org_vocab_padding: int,
    added_vocab_start_index: int,
    added_vocab_end_index: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of a vocab-parallel shard made local, and the mask of ids outside it (vLLM's
    VocabParallelEmbedding formula): org = start <= id < end, added = added_start <= id < added_end,
    masked = (id - start*org - (added_start - (end - start) - padding)*added) * (org | added), mask = ~(org | added)."""
    if input.dim() < 1:
        raise ValueError("get_masked_input_and_mask: input must have at least 1 dimension")
    if org_vocab_start_index < 0:
        raise ValueError("get_masked_input_and_mask: org_vocab_start_index must be non-negative")
    if org_vocab_end_index < org_vocab_start_index:
        raise ValueError("get_masked_input_and_mask: org_vocab_end_index must be greater than org_vocab_start_index")
    if num_org_vocab_padding < 0:
        raise ValueError("get_masked_input_and_mask: num_org_vocab_padding must be non-negative")
    if added_vocab_start_index < org_vocab_end_index:
        raise ValueError("get_masked_input_and_mask: added_vocab_start_index must be greater than org_vocab_end_index")
    if added_vocab_end_index < added_vocab_start_index:
        raise ValueError(
            "get_masked_input_and_mask: added_vocab_end_index must be greater than added_vocab_start_index"
        )
    if input.dtype != torch.int32:
        raise TypeError(f"get_masked_input_and_mask: the kernel reads int32 token ids only, got {input.dtype}")
    if added_vocab_end_index >= _FP32_EXACT_INTS:
        raise ValueError(
            f"get_masked_input_and_mask: the kernel compares ids as float32, exact below {_FP32_EXACT_INTS}; "
            f"indices up to {added_vocab_end_index} are beyond it"
        )
    ids = input.to(torch.int64)
    org = (ids >= org_vocab_start_index) & (ids < org_vocab_end_index)
    added = (ids >= added_vocab_start_index) & (ids < added_vocab_end_index)
    added_offset = added_vocab_start_index - (org_vocab_end_index - org_vocab_start_index) - num_org_vocab_padding
    valid_offset = org_vocab_start_index * org + added_offset * added
    in_shard = org | added
    return ((ids - valid_offset) * in_shard).to(input.dtype), ~in_shard


def _verify(name: str, t: torch.Tensor, size_0: int, size_1: int, dtype: torch.dtype) -> None:
    """csrc's verify_tensor: size(0) and size(1) when not -1, contiguous, of `dtype`."""
    ok = (
        (size_0 == -1 or t.size(0) == size_0)
        and (size_1 == -1 or t.size(1) == size_1)
        and t.is_contiguous()
        and t.dtype == dtype
    )
    if not ok:
        raise ValueError(
            f"tensor: name = {name}, shape = {list(t.shape)} is_cont = {t.is_contiguous()}, type = {t.dtype} is "
            f"not as expected: shape = [{size_0}, {size_1}], type = {dtype}"
        )


def advance_step_flashattn_ascendc(
    num_seqs: int,
    num_queries: int,
    block_size: int,
    input_tokens: torch.Tensor,
    sampled_token_ids: torch.Tensor,
    input_positions: torch.Tensor,
    seq_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
) -> None:
    """One multi-step decode step, in place, for the first num_queries sequences i: input_tokens[i] =
    sampled_token_ids[i, 0], input_positions[i] = seq_lens[i], seq_lens[i] += 1, slot_mapping[i] =
    block_tables[i, p // block_size] * block_size + p % block_size with p the new position."""
    _verify("input_tokens", input_tokens, num_seqs, -1, torch.int64)
    _verify("sampled_token_ids", sampled_token_ids, num_queries, 1, torch.int64)
    _verify("input_positions", input_positions, num_seqs, -1, torch.int64)
    _verify("seq_lens", seq_lens, num_seqs, -1, torch.int32)
    _verify("slot_mapping", slot_mapping, num_seqs, -1, torch.int32)
    _verify("block_tables", block_tables, num_seqs, -1, torch.int32)
    if not 0 < num_queries <= num_seqs or block_size <= 0:
        raise ValueError(
            f"advance_step_flashattn_ascendc: needs 0 < num_queries <= num_seqs and block_size > 0, got "
            f"num_queries {num_queries}, num_seqs {num_seqs}, block_size {block_size}"
        )
    n = num_queries
    position = seq_lens[:n].to(torch.int64)
    block = position // block_size
    if int(block.max()) >= block_tables.size(1):
        raise IndexError(
            f"advance_step_flashattn_ascendc: a position needs block {int(block.max())} of a block table with "
            f"{block_tables.size(1)} columns"
        )
    slot = block_tables[:n].to(torch.int64).gather(1, block.unsqueeze(1)).squeeze(1) * block_size
    input_tokens[:n] = sampled_token_ids[:n, 0]
    input_positions[:n] = position
    seq_lens[:n] += 1
    slot_mapping[:n] = (slot + position % block_size).to(torch.int32)
