"""The attention kernels of vllm-ascend's MLA (mla_v1.AscendMLAImpl), in plain torch.

torch_npu.npu_fused_infer_attention_score  graph-mode decode: paged (or contiguous) KV, MLA's split
                                           query/key (q_nope.k_nope + q_rope.k_rope), layouts BNSD, BSND, BSH, TND
torch_npu.atb.npu_ring_mla                 prefill: causal attention per sequence, and its merge with the
                                           attention over earlier context chunks through (out, lse)
torch_npu._npu_paged_attention_mla         eager decode: paged attention whose value is the key's first
                                           mla_vheadsize dims

One formula underneath: out = softmax(scale * (q k^T [+ q_rope k_rope^T]), blocked) v, per query head, the
key/value head of query head n being n // (N / Nkv). Scores and softmax are computed in fp32 for half
precision inputs; lse = logsumexp of the scaled, unblocked scores (natural log). A query row with nothing
to attend to (no keys, or every key blocked) gives out = 0 and lse = -inf.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NO_LIMIT = 2147483647
FIA_LAYOUTS = ("BNSD", "BSND", "BSH", "TND")
FIA_SPARSE_MODES = (0, 1, 2, 3)  # 0/1 the given mask, 2 causal top-left, 3 causal bottom-right


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocked: torch.Tensor,
    scale: float,
    q_rope: torch.Tensor | None = None,
    k_rope: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, Sq, N, D], k [B, Skv, Nkv, D], v [B, Skv, Nkv, Dv], blocked [B, N or 1, Sq, Skv] (True = not
    attended); returns out [B, Sq, N, Dv] and lse [B, N, Sq], both in the work dtype."""
    work = _work_dtype(q)
    b, sq, n, d = q.shape
    skv, nkv = k.shape[1], k.shape[2]
    if n % nkv:
        raise ValueError(f"attention: {n} query heads are not a multiple of {nkv} key/value heads")
    g = n // nkv
    scores = torch.einsum("bsgjd,btgd->bgjst", q.to(work).reshape(b, sq, nkv, g, d), k.to(work))
    if q_rope is not None:
        qr = q_rope.to(work).reshape(b, sq, nkv, g, q_rope.shape[-1])
        scores = scores + torch.einsum("bsgjd,btgd->bgjst", qr, k_rope.to(work))
    scores = (scores.reshape(b, n, sq, skv) * scale).masked_fill(blocked, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    # a fully blocked row has lse = -inf; its probabilities become NaN here and are zeroed by the mask
    probs = torch.exp(scores - lse.unsqueeze(-1)).masked_fill(blocked, 0.0)
    out = torch.einsum("bgjst,btgd->bsgjd", probs.reshape(b, nkv, g, sq, skv), v.to(work))
    return out.reshape(b, sq, n, v.shape[-1]), lse


def _blocked(
    q_len: torch.Tensor, kv_len: torch.Tensor, sq: int, skv: int, causal: str | None, device: torch.device
) -> torch.Tensor:
    """[B, 1, Sq, Skv]: keys past a sequence's length, query rows past its length, and the causal upper part
    (top-left: key j after query i; bottom-right: j > i + kv_len - q_len, the query ending at the last key)."""
    i = torch.arange(sq, device=device).view(1, sq, 1)
    j = torch.arange(skv, device=device).view(1, 1, skv)
    ql, kl = q_len.to(device).view(-1, 1, 1), kv_len.to(device).view(-1, 1, 1)
    blocked = (j >= kl) | (i >= ql)
    if causal == "top_left":
        blocked = blocked | (j > i)
    elif causal == "bottom_right":
        blocked = blocked | (j > i + kl - ql)
    return blocked.unsqueeze(1)


def _pack(x: torch.Tensor, lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [T, ...] of consecutive sequences -> [B, max(lens), ...] zero padded, with (sequence, position)
    of each packed token for unpacking."""
    total = int(lens.sum())
    seq = torch.repeat_interleave(torch.arange(lens.numel()), lens).to(x.device)
    pos = torch.arange(total, device=x.device) - (torch.cumsum(lens, 0) - lens).to(x.device)[seq]
    smax = int(lens.max()) if lens.numel() else 0
    packed = x.new_zeros(lens.numel(), smax, *x.shape[1:])
    packed[seq, pos] = x[:total]
    return packed, seq, pos


def _lengths_from_ends(ends: Sequence[int] | None, total: int, what: str) -> torch.Tensor:
    if ends is None:
        raise ValueError(f"npu_fused_infer_attention_score: layout TND needs {what} (cumulative sequence ends)")
    e = torch.tensor([int(x) for x in ends], dtype=torch.long)
    lens = torch.diff(e, prepend=e.new_zeros(1))
    if e.numel() == 0 or (lens < 0).any() or int(e[-1]) > total:
        raise ValueError(
            f"npu_fused_infer_attention_score: {what}={e.tolist()} must be non-empty, non-decreasing cumulative "
            f"ends within the {total} tokens"
        )
    return lens


def _per_batch(lengths: Sequence[int] | None, batch: int, full: int, what: str) -> torch.Tensor:
    """A length per batch: None means the full extent, one value applies to all, more than B keeps the first B."""
    if lengths is None:
        return torch.full((batch,), full, dtype=torch.long)
    vals = [int(x) for x in lengths]
    if len(vals) == 1:
        vals = vals * batch
    if len(vals) < batch:
        raise ValueError(f"npu_fused_infer_attention_score: {what} has {len(vals)} entries for a batch of {batch}")
    out = torch.tensor(vals[:batch], dtype=torch.long)
    if (out < 0).any() or (out > full).any():
        raise ValueError(f"npu_fused_infer_attention_score: {what}={vals[:batch]} must lie within 0..{full}")
    return out


def _query_to_bsnd(x: torch.Tensor, layout: str, heads: int, what: str) -> torch.Tensor:
    if layout == "BNSD":
        n = x.shape[1]
        x = x.transpose(1, 2)
    elif layout == "BSND":
        n = x.shape[2]
    elif layout == "BSH":
        if x.shape[-1] % heads:
            raise ValueError(f"npu_fused_infer_attention_score: {what} hidden size {x.shape[-1]} is not N={heads} x D")
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[-1] // heads)
    else:  # TND: one sequence of T tokens until packed
        n = x.shape[1]
        x = x.unsqueeze(0)
    if n != heads:
        raise ValueError(f"npu_fused_infer_attention_score: {what} has {n} heads, num_heads is {heads}")
    return x


def _kv_to_bsnd(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return x.transpose(1, 2)
    if layout == "BSH":
        return x.reshape(x.shape[0], x.shape[1], heads, x.shape[-1] // heads)
    return x  # BSND; TND is packed by the caller


def _paged_to_bsnd(cache: torch.Tensor, table: torch.Tensor, block_size: int, kv_heads: int) -> torch.Tensor:
    """Gather each sequence's blocks: (num_blocks, block_size, H) or (num_blocks, Nkv, block_size, D)
    -> [B, table_columns * block_size, Nkv, D]."""
    if cache.dim() == 5:
        raise NotImplementedError(
            "npu_fused_infer_attention_score on CPU: the FRACTAL_NZ KV cache (num_blocks, N, D/16, block_size, 16) "
            "is not emulated; the A3 profile sets enable_kv_nz=False (ND cache)"
        )
    if cache.dim() == 3 and cache.shape[1] == block_size and cache.shape[2] % kv_heads == 0:
        blocks = cache.reshape(cache.shape[0], block_size, kv_heads, cache.shape[2] // kv_heads)
    elif cache.dim() == 4 and cache.shape[1] == kv_heads and cache.shape[2] == block_size:
        blocks = cache.transpose(1, 2)
    else:
        raise ValueError(
            f"npu_fused_infer_attention_score: a paged cache must be (num_blocks, {block_size}, {kv_heads} x D) or "
            f"(num_blocks, {kv_heads}, {block_size}, D) for block_size={block_size}, got {tuple(cache.shape)}"
        )
    gathered = blocks[table.long()]  # [B, columns, block_size, Nkv, D]
    return gathered.reshape(table.shape[0], table.shape[1] * block_size, kv_heads, blocks.shape[-1])


def _user_mask(mask: torch.Tensor, batch: int, heads: int, sq: int, skv: int, kv_len: torch.Tensor) -> torch.Tensor:
    """The given mask (nonzero = masked) as [B or 1, N or 1, Sq, Skv]; keys beyond its width are masked."""
    m = mask.to(torch.bool)
    if m.dim() == 2 and sq == 1 and m.shape[0] == batch:
        m = m.view(batch, 1, 1, m.shape[1])  # (B, KV_S): one key row per sequence of one query token
    elif m.dim() == 2:
        m = m.view(1, 1, *m.shape)
    elif m.dim() == 3:
        m = m.unsqueeze(1)
    width = m.shape[-1]
    if m.dim() != 4 or m.shape[-2] < sq or m.shape[0] not in (1, batch) or m.shape[1] not in (1, heads):
        raise ValueError(
            f"npu_fused_infer_attention_score: atten_mask {tuple(mask.shape)} does not fit B={batch}, N={heads}, "
            f"Sq={sq} (shapes: (Sq, Skv), (B|1, Sq, Skv), (B|1, 1|N, Sq, Skv), or (B, Skv) for one query token)"
        )
    if kv_len.numel() and int(kv_len.max()) > width:
        raise ValueError(
            f"npu_fused_infer_attention_score: atten_mask covers {width} keys, a sequence has {int(kv_len.max())}"
        )
    m = m[..., :sq, :skv]
    if width < skv:
        m = torch.cat((m, m.new_ones(*m.shape[:-1], skv - width)), dim=-1)
    return m


def fia_output_shapes(
    query: torch.Tensor,
    value: torch.Tensor,
    *,
    block_table: torch.Tensor | None,
    num_heads: int,
    num_key_value_heads: int,
    input_layout: str,
    softmax_lse_flag: bool,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shapes of (attention_out, softmax_lse): out is the query's shape with the value's head dim."""
    if input_layout not in FIA_LAYOUTS:
        raise ValueError(
            f"npu_fused_infer_attention_score: input_layout must be one of {FIA_LAYOUTS} on CPU, got {input_layout!r}"
        )
    expected_dims = 3 if input_layout in ("BSH", "TND") else 4
    if query.dim() != expected_dims:
        raise ValueError(
            f"npu_fused_infer_attention_score: a {input_layout} query is {expected_dims}-D, got {tuple(query.shape)}"
        )
    kv_heads = num_key_value_heads or num_heads
    if block_table is not None:
        dv = value.shape[-1] // kv_heads if value.dim() == 3 else value.shape[-1]
    elif input_layout == "BSH":
        dv = value.shape[-1] // kv_heads
    else:
        dv = value.shape[-1]
    out = (*query.shape[:-1], num_heads * dv) if input_layout == "BSH" else (*query.shape[:-1], dv)
    if not softmax_lse_flag:
        return out, (1,)
    if input_layout == "TND":
        return out, (query.shape[0], num_heads, 1)
    b, s = query.shape[0], query.shape[2] if input_layout == "BNSD" else query.shape[1]
    return out, (b, num_heads, s, 1)


def npu_fused_infer_attention_score(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    pse_shift: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    actual_seq_lengths: Sequence[int] | None = None,
    actual_seq_lengths_kv: Sequence[int] | None = None,
    dequant_scale1: torch.Tensor | None = None,
    quant_scale1: torch.Tensor | None = None,
    dequant_scale2: torch.Tensor | None = None,
    quant_scale2: torch.Tensor | None = None,
    quant_offset2: torch.Tensor | None = None,
    antiquant_scale: torch.Tensor | None = None,
    antiquant_offset: torch.Tensor | None = None,
    block_table: torch.Tensor | None = None,
    query_padding_size: torch.Tensor | None = None,
    kv_padding_size: torch.Tensor | None = None,
    key_antiquant_scale: torch.Tensor | None = None,
    key_antiquant_offset: torch.Tensor | None = None,
    value_antiquant_scale: torch.Tensor | None = None,
    value_antiquant_offset: torch.Tensor | None = None,
    key_shared_prefix: torch.Tensor | None = None,
    value_shared_prefix: torch.Tensor | None = None,
    actual_shared_prefix_len: Sequence[int] | None = None,
    query_rope: torch.Tensor | None = None,
    key_rope: torch.Tensor | None = None,
    key_rope_antiquant_scale: torch.Tensor | None = None,
    num_heads: int = 1,
    scale: float = 1.0,
    pre_tokens: int = NO_LIMIT,
    next_tokens: int = NO_LIMIT,
    input_layout: str = "BSH",
    num_key_value_heads: int = 0,
    sparse_mode: int = 0,
    inner_precise: int = 0,
    block_size: int = 0,
    antiquant_mode: int = 0,
    softmax_lse_flag: bool = False,
    key_antiquant_mode: int = 0,
    value_antiquant_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(attention_out in input_layout, softmax_lse): out = softmax(scale * (q k^T + q_rope k_rope^T), blocked) v.

    With block_table, key/value/key_rope are paged caches (num_blocks, block_size, H) or (num_blocks, Nkv,
    block_size, D) and sequence b reads its first actual_seq_lengths_kv[b] tokens through block_table[b];
    without, they have the query's layout. actual_seq_lengths: per-batch query lengths (TND: cumulative ends);
    actual_seq_lengths_kv: per-batch key lengths (TND without paging: cumulative ends). Blocked: keys past a
    sequence's length, and per sparse_mode 0/1 the given mask (nonzero = masked), 2 key j > query i,
    3 j > i + kv_len - q_len. softmax_lse is [1] zeros unless softmax_lse_flag ((B, N, S, 1); TND (T, N, 1)).
    Quantization, pse, prefixes, paddings and the pre/next token band are not emulated (NotImplementedError).
    """
    unsupported = {
        "pse_shift": pse_shift,
        "dequant_scale1": dequant_scale1,
        "quant_scale1": quant_scale1,
        "dequant_scale2": dequant_scale2,
        "quant_scale2": quant_scale2,
        "quant_offset2": quant_offset2,
        "antiquant_scale": antiquant_scale,
        "antiquant_offset": antiquant_offset,
        "query_padding_size": query_padding_size,
        "kv_padding_size": kv_padding_size,
        "key_antiquant_scale": key_antiquant_scale,
        "key_antiquant_offset": key_antiquant_offset,
        "value_antiquant_scale": value_antiquant_scale,
        "value_antiquant_offset": value_antiquant_offset,
        "key_shared_prefix": key_shared_prefix,
        "value_shared_prefix": value_shared_prefix,
        "actual_shared_prefix_len": actual_shared_prefix_len,
        "key_rope_antiquant_scale": key_rope_antiquant_scale,
    }
    given = [name for name, val in unsupported.items() if val is not None]
    if given or pre_tokens != NO_LIMIT or next_tokens != NO_LIMIT:
        band = [] if pre_tokens == NO_LIMIT and next_tokens == NO_LIMIT else ["pre_tokens/next_tokens"]
        raise NotImplementedError(
            "npu_fused_infer_attention_score on CPU: not emulated: " + ", ".join(given + band) + " (vllm-ascend's "
            "unquantized MLA passes none of them)"
        )
    out_shape, lse_shape = fia_output_shapes(
        query,
        value,
        block_table=block_table,
        num_heads=num_heads,
        num_key_value_heads=num_key_value_heads,
        input_layout=input_layout,
        softmax_lse_flag=softmax_lse_flag,
    )
    if sparse_mode not in FIA_SPARSE_MODES:
        raise NotImplementedError(
            f"npu_fused_infer_attention_score on CPU: sparse_mode must be one of {FIA_SPARSE_MODES}, got {sparse_mode}"
        )
    if sparse_mode == 1 and atten_mask is None:
        raise ValueError("npu_fused_infer_attention_score: sparse_mode 1 (allMask) needs atten_mask")
    if (query_rope is None) != (key_rope is None):
        raise ValueError("npu_fused_infer_attention_score: query_rope and key_rope come together or not at all")
    kv_heads = num_key_value_heads or num_heads
    if num_heads % kv_heads:
        raise ValueError(
            f"npu_fused_infer_attention_score: num_heads {num_heads} is not a multiple of "
            f"num_key_value_heads {kv_heads}"
        )
    layout = input_layout
    q = _query_to_bsnd(query, layout, num_heads, "query")
    qr = None if query_rope is None else _query_to_bsnd(query_rope, layout, num_heads, "query_rope")
    seq = pos = None
    if layout == "TND":
        q_len = _lengths_from_ends(actual_seq_lengths, query.shape[0], "actual_seq_lengths")
        q, seq, pos = _pack(q[0], q_len)
        qr = None if qr is None else _pack(qr[0], q_len)[0]
    batch, sq = q.shape[0], q.shape[1]
    if layout != "TND":
        q_len = _per_batch(actual_seq_lengths, batch, sq, "actual_seq_lengths")

    kr = None
    if block_table is not None:
        if block_size <= 0:
            raise ValueError(f"npu_fused_infer_attention_score: paged attention needs block_size > 0, got {block_size}")
        if actual_seq_lengths_kv is None:
            raise ValueError("npu_fused_infer_attention_score: paged attention needs actual_seq_lengths_kv")
        if block_table.dim() != 2 or block_table.shape[0] != batch:
            raise ValueError(
                f"npu_fused_infer_attention_score: block_table {tuple(block_table.shape)} must be ({batch}, max_blocks)"
            )
        kv_len = _per_batch(actual_seq_lengths_kv, batch, block_table.shape[1] * block_size, "actual_seq_lengths_kv")
        columns = -(-int(kv_len.max()) // block_size) if batch else 0
        table = block_table[:, :columns]  # columns past every sequence's end are never read
        k = _paged_to_bsnd(key, table, block_size, kv_heads)
        v = _paged_to_bsnd(value, table, block_size, kv_heads)
        if key_rope is not None:
            kr = _paged_to_bsnd(key_rope, table, block_size, kv_heads)
    elif layout == "TND":
        kv_len = _lengths_from_ends(actual_seq_lengths_kv, key.shape[0], "actual_seq_lengths_kv")
        if kv_len.numel() != batch:
            raise ValueError(
                f"npu_fused_infer_attention_score: actual_seq_lengths_kv gives {kv_len.numel()} sequences, "
                f"actual_seq_lengths {batch}"
            )
        k, v = _pack(key, kv_len)[0], _pack(value, kv_len)[0]
        kr = None if key_rope is None else _pack(key_rope, kv_len)[0]
    else:
        k, v = _kv_to_bsnd(key, layout, kv_heads), _kv_to_bsnd(value, layout, kv_heads)
        kr = None if key_rope is None else _kv_to_bsnd(key_rope, layout, kv_heads)
        kv_len = _per_batch(actual_seq_lengths_kv, batch, k.shape[1], "actual_seq_lengths_kv")
    if k.shape[2] != kv_heads or k.shape[0] != batch:
        raise ValueError(
            f"npu_fused_infer_attention_score: key gives batch {k.shape[0]} x {k.shape[2]} heads, expected "
            f"{batch} x num_key_value_heads {kv_heads}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"npu_fused_infer_attention_score: query head dim {q.shape[-1]} != key head dim {k.shape[-1]}")

    skv = k.shape[1]
    causal = {2: "top_left", 3: "bottom_right"}.get(sparse_mode)
    blocked = _blocked(q_len, kv_len, sq, skv, causal, query.device)
    if atten_mask is not None and sparse_mode in (0, 1):
        blocked = blocked | _user_mask(atten_mask, batch, num_heads, sq, skv, kv_len).to(query.device)
    out, lse = attend(q, k, v, blocked, scale, qr, kr)

    if layout == "TND":
        out_tokens = out.new_zeros(query.shape[0], num_heads, out.shape[-1])
        lse_tokens = lse.new_full((query.shape[0], num_heads), float("-inf"))
        out_tokens[: seq.numel()] = out[seq, pos]
        lse_tokens[: seq.numel()] = lse.transpose(1, 2)[seq, pos]
        attention_out, lse_out = out_tokens, lse_tokens.unsqueeze(-1)
    else:
        attention_out, lse_out = (out.transpose(1, 2) if layout == "BNSD" else out), lse.unsqueeze(-1)
    attention_out = attention_out.reshape(out_shape).to(query.dtype).contiguous()
    if not softmax_lse_flag:
        return attention_out, torch.zeros(lse_shape, dtype=torch.float32, device=query.device)
    return attention_out, lse_out.reshape(lse_shape).float().contiguous()


def _ring_lengths(seqlen: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lens = seqlen.to("cpu", torch.long)
    if lens.dim() == 1:
        return lens, lens
    if lens.dim() == 2 and lens.shape[0] == 2:
        return lens[0], lens[1]
    raise ValueError(
        f"npu_ring_mla: seqlen must be [batch] or [2, batch] (query, key lengths), got {tuple(lens.shape)}"
    )


def merge_attention(
    prev_out: torch.Tensor, prev_lse: torch.Tensor, cur_out: torch.Tensor, cur_lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The softmax over the union of two key sets from the parts: lse = log(e^l1 + e^l2),
    out = out1 e^(l1 - lse) + out2 e^(l2 - lse); a side with lse = -inf weighs 0. lse broadcasts to out[..., 0]."""
    lse = torch.logaddexp(prev_lse, cur_lse)
    finite = torch.isfinite(lse)
    w_prev = torch.where(finite, torch.exp(prev_lse - lse), torch.zeros_like(lse)).unsqueeze(-1)
    w_cur = torch.where(finite, torch.exp(cur_lse - lse), torch.zeros_like(lse)).unsqueeze(-1)
    return prev_out * w_prev + cur_out * w_cur, lse


def npu_ring_mla(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    seqlen: torch.Tensor,
    head_num: int,
    kv_head_num: int,
    *,
    pre_out: torch.Tensor | None = None,
    prev_lse: torch.Tensor | None = None,
    qk_scale: float = 1.0,
    kernel_type: str | None = None,
    mask_type: str | None = None,
    input_layout: str | None = None,
    calc_type: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [Tq, N, Dv], softmax_lse [N, Tq] fp32). Tokens of consecutive sequences (layout type_bsnd:
    [T, heads, D]); sequence b has seqlen[b] query and key tokens, or seqlen[0][b] / seqlen[1][b]. Per
    sequence: softmax(qk_scale * (q_nope k_nope^T + q_rope k_rope^T)) value, causal under mask_type_triu (the
    mask tensor's contents are not read: the triangle is generated). calc_type_first_ring returns that;
    calc_type_default merges it with (pre_out, prev_lse), the attention over other keys, into the attention
    over both. Defaults as torch_npu: high precision, no_mask, type_bsnd, calc_type_first_ring."""
    kernel_type = kernel_type or "kernel_type_high_precision"
    mask_type = mask_type or "no_mask"
    input_layout = input_layout or "type_bsnd"
    calc_type = calc_type or "calc_type_first_ring"
    for name, t in (("q_nope", q_nope), ("q_rope", q_rope), ("k_nope", k_nope), ("k_rope", k_rope), ("value", value)):
        if t.dim() != 3:
            raise ValueError(f"npu_ring_mla: {name} must be [tokens, heads, dim] (type_bsnd), got {tuple(t.shape)}")
    kv_heads = kv_head_num or head_num
    if q_nope.shape[1] != head_num or k_nope.shape[1] != kv_heads or value.shape[1] != kv_heads:
        raise ValueError(
            f"npu_ring_mla: heads q {q_nope.shape[1]}, k {k_nope.shape[1]}, v {value.shape[1]} do not match "
            f"head_num={head_num}, kv_head_num={kv_head_num}"
        )
    q_len, kv_len = _ring_lengths(seqlen)
    if int(q_len.sum()) != q_nope.shape[0] or int(kv_len.sum()) != k_nope.shape[0]:
        raise ValueError(
            f"npu_ring_mla: seqlen sums to {int(q_len.sum())} query / {int(kv_len.sum())} key tokens, the inputs have "
            f"{q_nope.shape[0]} / {k_nope.shape[0]}"
        )
    if mask_type == "mask_type_triu" and not torch.equal(q_len, kv_len):
        raise NotImplementedError(
            "npu_ring_mla on CPU: mask_type_triu with query and key lengths that differ is not emulated "
            "(vllm-ascend uses the triangle only for a chunk attending to itself)"
        )
    q, seq, pos = _pack(q_nope, q_len)
    qr = _pack(q_rope, q_len)[0]
    k, kr, v = _pack(k_nope, kv_len)[0], _pack(k_rope, kv_len)[0], _pack(value, kv_len)[0]
    causal = "bottom_right" if mask_type == "mask_type_triu" else None
    blocked = _blocked(q_len, kv_len, q.shape[1], k.shape[1], causal, q_nope.device)
    out, lse = attend(q, k, v, blocked, qk_scale, qr, kr)
    out_tokens, lse_tokens = out[seq, pos], lse.transpose(1, 2)[seq, pos]  # [Tq, N, Dv], [Tq, N]
    if calc_type == "calc_type_default":
        if pre_out is None or prev_lse is None:
            raise ValueError("npu_ring_mla: calc_type_default merges into pre_out and prev_lse; both are required")
        if tuple(pre_out.shape) != tuple(out_tokens.shape) or tuple(prev_lse.shape) != (head_num, q_nope.shape[0]):
            raise ValueError(
                f"npu_ring_mla: pre_out {tuple(pre_out.shape)} / prev_lse {tuple(prev_lse.shape)} must be "
                f"{tuple(out_tokens.shape)} / {(head_num, q_nope.shape[0])}"
            )
        out_tokens, lse_tokens = merge_attention(
            pre_out.to(out_tokens.dtype), prev_lse.t().to(lse_tokens.dtype), out_tokens, lse_tokens
        )
    return out_tokens.to(q_nope.dtype), lse_tokens.t().float().contiguous()


def npu_ring_mla_out(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor,
    seqlen: torch.Tensor,
    head_num: int,
    kv_head_num: int,
    *,
    pre_out: torch.Tensor | None = None,
    prev_lse: torch.Tensor | None = None,
    qk_scale: float = 1.0,
    kernel_type: str | None = None,
    mask_type: str | None = None,
    input_layout: str | None = None,
    calc_type: str | None = None,
    output: torch.Tensor,
    softmax_lse: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The out= form vllm-ascend calls; output/softmax_lse may be pre_out/prev_lse themselves (read before
    written)."""
    out, lse = npu_ring_mla(
        q_nope,
        q_rope,
        k_nope,
        k_rope,
        value,
        mask,
        seqlen,
        head_num,
        kv_head_num,
        pre_out=pre_out,
        prev_lse=prev_lse,
        qk_scale=qk_scale,
        kernel_type=kernel_type,
        mask_type=mask_type,
        input_layout=input_layout,
        calc_type=calc_type,
    )
    if tuple(output.shape) != tuple(out.shape) or tuple(softmax_lse.shape) != tuple(lse.shape):
        raise ValueError(
            f"npu_ring_mla: output {tuple(output.shape)} / softmax_lse {tuple(softmax_lse.shape)} must be "
            f"{tuple(out.shape)} / {tuple(lse.shape)}"
        )
    output.copy_(out)
    softmax_lse.copy_(lse)
    return output, softmax_lse


def npu_paged_attention_mla(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    num_kv_heads: int,
    num_heads: int,
    scale_value: float,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    mla_vheadsize: int,
    out: torch.Tensor,
) -> None:
    """torch_npu._npu_paged_attention_mla, into out [B, N, mla_vheadsize]: query [B, N, D] (one token per
    sequence) attends to the first context_lens[b] tokens of sequence b in key_cache (num_blocks, block_size,
    Nkv, D) through block_table[b]; the value is the key's first mla_vheadsize dims."""
    if query.dim() != 3 or key_cache.dim() != 4:
        raise ValueError(
            f"_npu_paged_attention_mla: query must be [B, N, D] and key_cache (num_blocks, block_size, Nkv, D), got "
            f"{tuple(query.shape)} and {tuple(key_cache.shape)}"
        )
    batch, _, dim = query.shape
    if query.shape[1] != num_heads or key_cache.shape[2] != num_kv_heads or key_cache.shape[3] != dim:
        raise ValueError(
            f"_npu_paged_attention_mla: query {tuple(query.shape)} / key_cache {tuple(key_cache.shape)} do not match "
            f"num_heads={num_heads}, num_kv_heads={num_kv_heads}"
        )
    if not 0 < mla_vheadsize <= dim or tuple(out.shape) != (batch, num_heads, mla_vheadsize):
        raise ValueError(
            f"_npu_paged_attention_mla: out {tuple(out.shape)} must be ({batch}, {num_heads}, {mla_vheadsize}) with "
            f"mla_vheadsize within the head dim {dim}"
        )
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(
            f"_npu_paged_attention_mla: block_table {tuple(block_table.shape)} must be ({batch}, max_blocks)"
        )
    block_size = key_cache.shape[1]
    kv_len = context_lens.to("cpu", torch.long).reshape(-1)
    if kv_len.numel() != batch or (kv_len < 0).any() or (kv_len > block_table.shape[1] * block_size).any():
        raise ValueError(
            f"_npu_paged_attention_mla: context_lens {kv_len.tolist()} must give one length per sequence within "
            f"{block_table.shape[1] * block_size} tokens"
        )
    columns = -(-int(kv_len.max()) // block_size) if batch else 0
    k = _paged_to_bsnd(
        key_cache.reshape(key_cache.shape[0], block_size, -1), block_table[:, :columns], block_size, num_kv_heads
    )
    blocked = _blocked(torch.ones_like(kv_len), kv_len, 1, k.shape[1], None, query.device)
    result, _ = attend(query.unsqueeze(1), k, k[..., :mla_vheadsize], blocked, scale_value)
    out.copy_(result.squeeze(1))
