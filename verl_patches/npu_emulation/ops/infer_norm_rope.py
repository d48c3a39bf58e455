"""The inference-only norm and rotary ops of vllm-ascend's DeepSeek path, in plain torch.

torch_npu.npu_add_rms_norm          x = x1 + x2; y = RMSNorm(x) * gamma; returns (y, rstd, x)
torch_npu.npu_interleave_rope       RoPE on interleaved pairs: de-interleave, then x*cos + rotate_half(x)*sin
torch_npu.npu_kv_rmsnorm_rope_cache MLA's kv_a output: RMSNorm on the latent part, interleaved RoPE on the rope
                                    part, both scattered into their paged caches (in place)
torch_npu._npu_rotary_embedding     vLLM's rotary_embedding (ATB): in-place RoPE of query and key from a
                                    [max_position, rot_dim] cos|sin cache

Half-precision inputs are computed in fp32 and rounded once at the end, as the kernels accumulate.
"""

from __future__ import annotations

import torch

from verl_patches.npu_emulation.ops.norm import npu_rms_norm
from verl_patches.npu_emulation.ops.paged_cache import write_slots
from verl_patches.npu_emulation.ops.rotary import INTERLEAVED, ROTATE_HALF, npu_rotary_position_embedding

# cache_mode values: emulated; known but not emulated (the NZ layouts come only with enable_kv_nz, the block-start
# layout is unused by vllm-ascend)
KV_CACHE_MODES = ("PA", "PA_BNSD", "Norm")
UNEMULATED_CACHE_MODES = ("PA_NZ", "PA_BLK_NZ", "PA_BLK_BNSD")


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else x.dtype


def npu_add_rms_norm(
    x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, rstd, x): x = x1 + x2 (summed in fp32, returned in x1's dtype), y = x * rsqrt(mean(x^2) + eps) * gamma
    from the unrounded sum, rstd as npu_rms_norm returns it."""
    if x1.shape != x2.shape:
        raise ValueError(f"npu_add_rms_norm: x1 {tuple(x1.shape)} and x2 {tuple(x2.shape)} differ in shape")
    if tuple(x1.shape[x1.dim() - gamma.dim() :]) != tuple(gamma.shape):
        raise ValueError(
            f"npu_add_rms_norm: gamma {tuple(gamma.shape)} does not match the trailing dims of x {tuple(x1.shape)}"
        )
    work = _work_dtype(x1)
    x = x1.to(work) + x2.to(work)
    y, rstd = npu_rms_norm(x, gamma, epsilon)
    return y.to(x1.dtype), rstd, x.to(x1.dtype)


def deinterleave(x: torch.Tensor) -> torch.Tensor:
    """[x0, x1, x2, x3, ...] -> [x0, x2, ..., x1, x3, ...] on the last dim (the kernels' reshape-transpose)."""
    d = x.shape[-1]
    return x.reshape(*x.shape[:-1], d // 2, 2).transpose(-1, -2).reshape(x.shape)


def _check_rope_operands(what: str, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    if x.shape[-1] % 2:
        raise ValueError(f"{what}: the rotary dim must be even, got {x.shape[-1]}")
    if cos.shape != sin.shape:
        raise ValueError(f"{what}: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} differ in shape")
    if cos.shape[-1] != x.shape[-1]:
        raise ValueError(f"{what}: cos/sin last dim {cos.shape[-1]} differs from the rotated dim {x.shape[-1]}")
    try:
        torch.broadcast_shapes(x.shape, cos.shape)
    except RuntimeError as err:
        raise ValueError(f"{what}: cos/sin {tuple(cos.shape)} do not broadcast to {tuple(x.shape)}") from err


def npu_interleave_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """q = deinterleave(x); q*cos + rotate_half(q)*sin. x (B, N, S, D); cos/sin broadcast to x, (B, 1, S|1, D)."""
    if x.dim() != 4:
        raise ValueError(f"npu_interleave_rope: x must be 4-D (B, N, S, D), got shape {tuple(x.shape)}")
    _check_rope_operands("npu_interleave_rope", x, cos, sin)
    work = _work_dtype(x)
    out = npu_rotary_position_embedding(deinterleave(x.to(work)), cos.to(work), sin.to(work), ROTATE_HALF)
    return out.to(x.dtype)


def npu_kv_rmsnorm_rope_cache(
    kv: torch.Tensor,
    gamma: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    index: torch.Tensor,
    k_cache: torch.Tensor,
    ckv_cache: torch.Tensor,
    *,
    k_rope_scale: torch.Tensor | None = None,
    c_kv_scale: torch.Tensor | None = None,
    k_rope_offset: torch.Tensor | None = None,
    c_kv_offset: torch.Tensor | None = None,
    epsilon: float = 1e-5,
    cache_mode: str = "Norm",
    is_output_kv: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """kv (B, N, S, Dv + Dk) splits into c = kv[..., :Dv] (Dv = gamma's size) and r = kv[..., Dv:];
    y = RMSNorm(c) * gamma, k = interleave_rope(r, cos, sin). PA/PA_BNSD: token (b, s) goes to slot
    index[b * S + s] of ckv_cache (y) and k_cache (k), caches (num_blocks, block_size, N, D), negative slots
    skipped; Norm: to position index[b, s] of sequence b, caches (B, N, cache_length, D). Returns (k_cache,
    ckv_cache, k, y): the caches themselves, updated in place, and the computed values (returned whether or
    not is_output_kv; the NPU leaves them unspecified without it)."""
    del is_output_kv  # the values are computed either way
    quant = (
        ("k_rope_scale", k_rope_scale),
        ("c_kv_scale", c_kv_scale),
        ("k_rope_offset", k_rope_offset),
        ("c_kv_offset", c_kv_offset),
    )
    given = [name for name, t in quant if t is not None]
    if given:
        raise NotImplementedError(
            f"npu_kv_rmsnorm_rope_cache on CPU: the int8-quantised cache ({', '.join(given)}) is not emulated; "
            "the A3 profile runs without quantization"
        )
    if cache_mode in UNEMULATED_CACHE_MODES:
        raise NotImplementedError(
            f"npu_kv_rmsnorm_rope_cache on CPU: cache_mode {cache_mode!r} (FRACTAL_NZ / block-start layouts) is not "
            f"emulated; the A3 profile sets enable_kv_nz=False, which uses 'PA'. Emulated: {KV_CACHE_MODES}"
        )
    if cache_mode not in KV_CACHE_MODES:
        raise ValueError(
            f"npu_kv_rmsnorm_rope_cache: cache_mode must be one of {KV_CACHE_MODES + UNEMULATED_CACHE_MODES}, "
            f"got {cache_mode!r}"
        )
    if kv.dim() != 4 or gamma.dim() != 1:
        raise ValueError(
            f"npu_kv_rmsnorm_rope_cache: kv must be 4-D (B, N, S, D) and gamma 1-D, got {tuple(kv.shape)} and "
            f"{tuple(gamma.shape)}"
        )
    dv = gamma.shape[0]
    if kv.shape[-1] <= dv:
        raise ValueError(f"npu_kv_rmsnorm_rope_cache: kv's last dim {kv.shape[-1]} leaves no rope part after {dv}")
    latent, rope = kv[..., :dv], kv[..., dv:]
    _check_rope_operands("npu_kv_rmsnorm_rope_cache", rope, cos, sin)
    y, _ = npu_rms_norm(latent, gamma, epsilon)
    k = npu_interleave_rope(rope, cos, sin)
    b, n, s, _ = kv.shape
    if cache_mode == "Norm":
        _write_per_sequence(k_cache, index, k)
        _write_per_sequence(ckv_cache, index, y)
    else:
        if index.numel() != b * s:
            raise ValueError(
                f"npu_kv_rmsnorm_rope_cache: cache_mode {cache_mode!r} needs one slot per token ({b * s}), "
                f"index has {index.numel()}"
            )
        write_slots(k_cache, index, k.transpose(1, 2).reshape(b * s, n, k.shape[-1]), "npu_kv_rmsnorm_rope_cache")
        write_slots(ckv_cache, index, y.transpose(1, 2).reshape(b * s, n, dv), "npu_kv_rmsnorm_rope_cache")
    return k_cache, ckv_cache, k, y


def _write_per_sequence(cache: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> None:
    """Norm mode: cache (B, N, L, D)[b, :, index[b, s]] = rows (B, N, S, D)[b, :, s]."""
    b, n, s, d = rows.shape
    if cache.dim() != 4 or cache.shape[0] != b or cache.shape[1] != n or cache.shape[3] != d:
        raise ValueError(
            f"npu_kv_rmsnorm_rope_cache: cache_mode 'Norm' needs a cache ({b}, {n}, cache_length, {d}), "
            f"got {tuple(cache.shape)}"
        )
    if tuple(index.shape) != (b, s):
        raise ValueError(
            f"npu_kv_rmsnorm_rope_cache: cache_mode 'Norm' needs index ({b}, {s}), got {tuple(index.shape)}"
        )
    seq = torch.arange(b, device=cache.device).view(b, 1).expand(b, s)
    cache.permute(0, 2, 1, 3)[seq, index.long()] = rows.transpose(1, 2).to(cache.dtype)


def npu_rotary_embedding(
    positions: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox_style: bool,
) -> None:
    """torch_npu._npu_rotary_embedding, in place: for each token t and each head, the first rot_dim dims
    (rot_dim = cos_sin_cache's width; cos = cache[pos, :rot_dim/2], sin = cache[pos, rot_dim/2:]) are rotated,
    neox style pairing (i, i + rot_dim/2), else (2i, 2i + 1). query/key [T, heads * head_size] or
    [T, heads, head_size]."""
    rot_dim = cos_sin_cache.shape[-1]
    if rot_dim % 2 or rot_dim > head_size:
        raise ValueError(
            f"_npu_rotary_embedding: cos_sin_cache width {rot_dim} must be even and at most head_size {head_size}"
        )
    pos = positions.reshape(-1).long()
    cos, sin = cos_sin_cache[pos].chunk(2, dim=-1)
    mode = ROTATE_HALF if is_neox_style else INTERLEAVED
    full_cos = torch.cat((cos, cos), -1) if is_neox_style else cos.repeat_interleave(2, -1)
    full_sin = torch.cat((sin, sin), -1) if is_neox_style else sin.repeat_interleave(2, -1)
    for name, x in (("query", query), ("key", key)):
        if x.shape[0] != pos.shape[0] or x[0].numel() % head_size or not x.is_contiguous():
            raise ValueError(
                f"_npu_rotary_embedding: {name} {tuple(x.shape)} is not a contiguous [{pos.shape[0]} tokens, "
                f"heads * {head_size}] tensor"
            )
        heads = x.view(pos.shape[0], -1, head_size)
        work = _work_dtype(x)
        part = heads[..., :rot_dim].to(work)
        c, s = full_cos.to(work).unsqueeze(1), full_sin.to(work).unsqueeze(1)
        heads[..., :rot_dim] = npu_rotary_position_embedding(part, c, s, mode).to(x.dtype)
