"""torch_npu.npu_fusion_attention (and MindSpeed's v2 builder op) with its gradient, in plain torch.

Reference formula: out = softmax(scale * q k^T, masked) v, per head, with key/value heads shared by
groups of query heads (GQA). A mask value of True (or 1) means "masked out". The value head dim may
differ from the query head dim. Computed in fp32 for half-precision inputs, as the kernel accumulates.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

NO_LIMIT = 2147483647
LAYOUTS = ("BNSD", "BSND", "BSH", "SBH", "TND")
# sparse_mode: 0 the given mask plus the pre/next token band; 1 the given mask only; 2 causal aligned
# top-left; 3 causal aligned bottom-right; 4 the pre/next band aligned bottom-right.
SPARSE_MODES = (0, 1, 2, 3, 4)


def _to_bnsd(x: torch.Tensor, layout: str, heads: int) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    if layout == "BSH":
        b, s, h = x.shape
        return x.view(b, s, heads, h // heads).transpose(1, 2)
    if layout == "SBH":
        s, b, h = x.shape
        return x.view(s, b, heads, h // heads).permute(1, 2, 0, 3)
    raise ValueError(f"npu_fusion_attention: input_layout must be one of {LAYOUTS}, got {layout!r}")


def _from_bnsd(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "BNSD":
        return x
    if layout == "BSND":
        return x.transpose(1, 2)
    b, n, s, d = x.shape
    if layout == "BSH":
        return x.transpose(1, 2).reshape(b, s, n * d)
    return x.permute(2, 0, 1, 3).reshape(s, b, n * d)  # SBH


def _kv_heads(x: torch.Tensor, layout: str, q_heads: int, q: torch.Tensor) -> int:
    """Key/value head count: explicit in BNSD/BSND/TND, inferred from the hidden size in BSH/SBH."""
    if layout == "BNSD":
        return x.shape[1]
    if layout in ("BSND", "TND"):
        return x.shape[2] if layout == "BSND" else x.shape[1]
    head_dim = q.shape[-1] // q_heads
    return x.shape[-1] // head_dim


def band_mask(
    sq: int, skv: int, sparse_mode: int, pre_tokens: int, next_tokens: int, device: torch.device | None = None
) -> torch.Tensor | None:
    """The generated part of the mask ([sq, skv], True = masked), or None when nothing is generated."""
    i = torch.arange(sq, device=device).view(-1, 1)
    j = torch.arange(skv, device=device).view(1, -1)
    if sparse_mode == 2:
        return j > i
    if sparse_mode == 3:
        return j > i + (skv - sq)
    if sparse_mode == 4:
        shift = skv - sq
        return (j > i + shift + next_tokens) | (j < i + shift - pre_tokens)
    if sparse_mode == 0 and (pre_tokens < NO_LIMIT or next_tokens < NO_LIMIT):
        return (j > i + next_tokens) | (j < i - pre_tokens)
    return None


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, pse: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q [B,N,Sq,D], k [B,Nkv,Skv,D], v [B,Nkv,Skv,Dv]; returns out, row max, row sum (fp32)."""
    work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    n, nkv = q.shape[1], k.shape[1]
    if n % nkv:
        raise ValueError(f"npu_fusion_attention: {n} query heads are not a multiple of {nkv} key/value heads")
    if nkv != n:
        k = k.repeat_interleave(n // nkv, dim=1)
        v = v.repeat_interleave(n // nkv, dim=1)
    scores = torch.matmul(q.to(work), k.to(work).transpose(-1, -2)) * scale
    if pse is not None:
        scores = scores + pse.to(work)
    if mask is not None:
        scores = scores.masked_fill(mask, torch.finfo(work).min)
    row_max = scores.amax(dim=-1, keepdim=True)
    probs = torch.exp(scores - row_max)
    if mask is not None:
        probs = probs.masked_fill(mask, 0.0)  # a fully masked row gives 0, never NaN
    row_sum = probs.sum(dim=-1, keepdim=True)
    probs = probs / row_sum.clamp_min(torch.finfo(work).tiny)
    out = torch.matmul(probs, v.to(work)).to(q.dtype)
    return out, row_max, row_sum


def _full_mask(
    atten_mask: torch.Tensor | None,
    sq: int,
    skv: int,
    sparse_mode: int,
    pre_tokens: int,
    next_tokens: int,
    device: torch.device,
) -> torch.Tensor | None:
    if sparse_mode not in SPARSE_MODES:
        raise ValueError(f"npu_fusion_attention: sparse_mode must be one of {SPARSE_MODES}, got {sparse_mode!r}")
    mask = None
    if atten_mask is not None and sparse_mode in (0, 1):
        mask = atten_mask.to(torch.bool)
        if mask.dim() == 2:
            mask = mask.view(1, 1, *mask.shape)
        mask = mask[..., :sq, :skv]
    generated = band_mask(sq, skv, sparse_mode, pre_tokens, next_tokens, device)
    if generated is not None:
        generated = generated.view(1, 1, sq, skv)
        mask = generated if mask is None else (mask | generated)
    return mask


def _segments(lengths: Sequence[int] | None, total: int, what: str) -> list[tuple[int, int]]:
    if lengths is None:
        raise ValueError(f"npu_fusion_attention: layout TND needs {what} (cumulative sequence ends)")
    ends = [int(e) for e in lengths]
    if not ends or ends[-1] != total or any(b < a for a, b in zip(ends, ends[1:])):
        raise ValueError(f"npu_fusion_attention: {what}={ends} must be non-decreasing cumulative ends reaching {total}")
    starts = [0] + ends[:-1]
    return list(zip(starts, ends))


def fusion_attention_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = NO_LIMIT,
    next_tockens: int = NO_LIMIT,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(attention_out in input_layout, softmax_max [B,N,Sq,8], softmax_sum [B,N,Sq,8])."""
    if keep_prob != 1.0:
        raise NotImplementedError(
            "npu_fusion_attention on CPU: attention dropout (keep_prob < 1) is not emulated; "
            "the A3 profile trains with attention_dropout=0"
        )
    if input_layout == "TND":
        segs_q = _segments(actual_seq_qlen, query.shape[0], "actual_seq_qlen")
        segs_kv = _segments(actual_seq_kvlen, key.shape[0], "actual_seq_kvlen")
        if len(segs_q) != len(segs_kv):
            raise ValueError("npu_fusion_attention: actual_seq_qlen and actual_seq_kvlen differ in length")
        outs, maxes, sums = [], [], []
        for (qa, qb), (ka, kb) in zip(segs_q, segs_kv):
            q = query[qa:qb].transpose(0, 1).unsqueeze(0)
            k = key[ka:kb].transpose(0, 1).unsqueeze(0)
            v = value[ka:kb].transpose(0, 1).unsqueeze(0)
            mask = _full_mask(
                atten_mask
                if sparse_mode in (0, 1)
                and atten_mask is not None
                and atten_mask.dim() == 2
                and atten_mask.shape[0] >= qb - qa
                else None,
                qb - qa,
                kb - ka,
                sparse_mode,
                pre_tockens,
                next_tockens,
                query.device,
            )
            o, m, s = _attend(q, k, v, mask, scale, None)
            outs.append(o.squeeze(0).transpose(0, 1))
            maxes.append(m.squeeze(0).transpose(0, 1))
            sums.append(s.squeeze(0).transpose(0, 1))
        out = torch.cat(outs, dim=0)
        return out, torch.cat(maxes, 0).expand(-1, -1, 8), torch.cat(sums, 0).expand(-1, -1, 8)
    kv_heads = _kv_heads(key, input_layout, head_num, query)
    q = _to_bnsd(query, input_layout, head_num)
    k = _to_bnsd(key, input_layout, kv_heads)
    v = _to_bnsd(value, input_layout, kv_heads)
    mask = _full_mask(atten_mask, q.shape[2], k.shape[2], sparse_mode, pre_tockens, next_tockens, query.device)
    out, row_max, row_sum = _attend(q, k, v, mask, scale, pse)
    return _from_bnsd(out, input_layout), row_max.expand(-1, -1, -1, 8), row_sum.expand(-1, -1, -1, 8)


def npu_fusion_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    head_num: int,
    input_layout: str,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    scale: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = NO_LIMIT,
    next_tockens: int = NO_LIMIT,
    inner_precise: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    gen_mask_parallel: bool = True,
    sync: bool = False,
    **_: object,
) -> tuple:
    """torch_npu.npu_fusion_attention: (attention_out, softmax_max, softmax_sum, softmax_out, seed, offset, numels)."""
    if padding_mask is not None:
        raise NotImplementedError("npu_fusion_attention on CPU: padding_mask is reserved by the kernel and unsupported")
    out, row_max, row_sum = fusion_attention_forward(
        query,
        key,
        value,
        head_num,
        input_layout,
        pse,
        atten_mask,
        scale,
        keep_prob,
        pre_tockens,
        next_tockens,
        actual_seq_qlen,
        actual_seq_kvlen,
        sparse_mode,
    )
    empty = query.new_empty(0)
    return out, row_max, row_sum, empty, 0, 0, 0


def npu_fusion_attention_grad(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dy: torch.Tensor,
    head_num: int,
    input_layout: str,
    *,
    pse: torch.Tensor | None = None,
    padding_mask: torch.Tensor | None = None,
    atten_mask: torch.Tensor | None = None,
    softmax_max: torch.Tensor | None = None,
    softmax_sum: torch.Tensor | None = None,
    softmax_in: torch.Tensor | None = None,
    attention_in: torch.Tensor | None = None,
    scale_value: float = 1.0,
    keep_prob: float = 1.0,
    pre_tockens: int = NO_LIMIT,
    next_tockens: int = NO_LIMIT,
    inner_precise: int = 0,
    seed: int = 0,
    offset: int = 0,
    numels: int = 0,
    prefix: Sequence[int] | None = None,
    actual_seq_qlen: Sequence[int] | None = None,
    actual_seq_kvlen: Sequence[int] | None = None,
    sparse_mode: int = 0,
    **_: object,
) -> tuple:
    """(dq, dk, dv, dpse) of npu_fusion_attention, by recomputing the forward under autograd."""
    with torch.enable_grad():
        q = query.detach().requires_grad_(True)
        k = key.detach().requires_grad_(True)
        v = value.detach().requires_grad_(True)
        p = pse.detach().requires_grad_(True) if pse is not None else None
        out, _, _ = fusion_attention_forward(
            q,
            k,
            v,
            head_num,
            input_layout,
            p,
            atten_mask,
            scale_value,
            keep_prob,
            pre_tockens,
            next_tockens,
            actual_seq_qlen,
            actual_seq_kvlen,
            sparse_mode,
        )
        inputs = [q, k, v] + ([p] if p is not None else [])
        grads = torch.autograd.grad(out, inputs, dy)
    dpse = grads[3] if p is not None else query.new_empty(0)
    return grads[0], grads[1], grads[2], dpse


def npu_fusion_attention_v2(
    query,
    key,
    value,
    head_num,
    input_layout,
    pse,
    padding_mask,
    atten_mask,
    scale,
    keep_prob,
    pre_tokens,
    next_tokens,
    inner_precise,
    prefix,
    actual_seq_qlen,
    actual_seq_kvlen,
    sparse_mode,
    gen_mask_parallel,
    sync,
    pse_type,
    q_start_idx,
    kv_start_idx,
) -> tuple:
    """MindSpeed's builder op (positional arguments); pse_type 1 (pse added to the scores) only."""
    if pse is not None and pse_type not in (None, 1):
        raise NotImplementedError(
            f"npu_fusion_attention_v2 on CPU: pse_type {pse_type} (generated alibi) is not emulated"
        )
    return npu_fusion_attention(
        query,
        key,
        value,
        head_num,
        input_layout,
        pse,
        padding_mask,
        atten_mask,
        scale,
        keep_prob,
        pre_tokens,
        next_tokens,
        inner_precise,
        prefix,
        actual_seq_qlen,
        actual_seq_kvlen,
        sparse_mode,
    )


def npu_fusion_attention_grad_v2(
    query,
    key,
    value,
    dy,
    head_num,
    input_layout,
    pse,
    padding_mask,
    atten_mask,
    softmax_max,
    softmax_sum,
    softmax_in,
    attention_in,
    scale,
    keep_prob,
    pre_tokens,
    next_tokens,
    inner_precise,
    seed,
    offset,
    numels,
    prefix,
    actual_seq_qlen,
    actual_seq_kvlen,
    sparse_mode,
    gen_mask_parallel,
    sync,
    pse_type,
    q_start_idx,
    kv_start_idx,
) -> tuple:
    return npu_fusion_attention_grad(
        query,
        key,
        value,
        dy,
        head_num,
        input_layout,
        pse=pse,
        atten_mask=atten_mask,
        scale_value=scale,
        keep_prob=keep_prob,
        pre_tockens=pre_tokens,
        next_tockens=next_tokens,
        actual_seq_qlen=actual_seq_qlen,
        actual_seq_kvlen=actual_seq_kvlen,
        sparse_mode=sparse_mode,
    )
