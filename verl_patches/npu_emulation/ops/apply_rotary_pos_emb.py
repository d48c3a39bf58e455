"""torch_npu.npu_apply_rotary_pos_emb (aclnnApplyRotaryPosEmb) in plain torch.

The kernel rotates query and key in place (op-plugin's binding returns std::tie(query, key); its TorchAir converter
warns that the "out-of-place" schema is used in place), and vllm-ascend's caller reads the result from query and key.
The schema is the wheel's as written, without alias marks: a schema without them promises fresh outputs, so the
emulation writes query and key in place and returns copies of them. Formula, per CANN's documentation:
x_rot = cat(-x[..., D/2:], x[..., :D/2]), x := x*cos + x_rot*sin, for x = query and x = key.

Documented limits, refused here with the reason: layout "BSH" (the 4-D BSND layout, the only one torch_npu 2.5.1's
binding maps); query [B, S, N, D], key [B, S, Nk, D], cos and sin [B, S, 1, D]: B and S equal, D equal and even;
one dtype for all four, float16, bfloat16 or float32. float16 is computed in float16 arithmetic (each product and sum
rounded to half, as Ascend's vector units compute half natively and vllm-ascend's own rope kernel does), bfloat16 in
float32 (the vector units have no bfloat16 arithmetic) rounded once to bfloat16.

A3's job does not call it: vllm-ascend's rope_forward_oot takes it only for a caller that passes cos/sin it computed
(`is_cos_sin_cached`, Qwen2/Qwen3 models), never for DeepSeek's MLA.
"""

from __future__ import annotations

import torch

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LAYOUTS = ("BSH",)


def check_apply_rotary_pos_emb(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str
) -> None:
    """Refuse what aclnnApplyRotaryPosEmb refuses, naming the argument and the requirement."""
    if layout not in _LAYOUTS:
        raise ValueError(
            f"npu_apply_rotary_pos_emb: layout {layout!r} is not supported: torch_npu 2.5.1 maps only 'BSH' "
            "(query [B, S, N, D])"
        )
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        if t.dim() != 4:
            raise ValueError(
                f"npu_apply_rotary_pos_emb: {name} must be 4-D [B, S, N, D] (layout BSH), got {tuple(t.shape)}"
            )
        if t.dtype != query.dtype or t.dtype not in _DTYPES:
            raise TypeError(
                f"npu_apply_rotary_pos_emb: query, key, cos and sin must share one dtype of float16, bfloat16, "
                f"float32; got query {query.dtype}, {name} {t.dtype}"
            )
    b, s, _, d = query.shape
    if key.shape[0] != b or key.shape[1] != s or key.shape[3] != d:
        raise ValueError(
            f"npu_apply_rotary_pos_emb: key {tuple(key.shape)} must match query {tuple(query.shape)} in B, S and D"
        )
    for name, t in (("cos", cos), ("sin", sin)):
        if tuple(t.shape) != (b, s, 1, d):
            raise ValueError(
                f"npu_apply_rotary_pos_emb: {name} must be [B, S, 1, D] = {(b, s, 1, d)}, got {tuple(t.shape)}"
            )
    if d % 2:
        raise ValueError(f"npu_apply_rotary_pos_emb: the last dimension D must be even, got {d}")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    work = x.to(cos.dtype)
    half = work.shape[-1] // 2
    rotated = torch.cat((-work[..., half:], work[..., :half]), dim=-1)
    return (work * cos + rotated * sin).to(x.dtype)


def npu_apply_rotary_pos_emb(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "BSH"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate query and key in place (any strides: the results are written through the given views); returns copies
    of the rotated query and key."""
    check_apply_rotary_pos_emb(query, key, cos, sin, layout)
    work = torch.float16 if query.dtype == torch.float16 else torch.float32
    cos_w, sin_w = cos.to(work), sin.to(work)
    query.copy_(_rotate(query, cos_w, sin_w))
    key.copy_(_rotate(key, cos_w, sin_w))
    return query.clone(), key.clone()
