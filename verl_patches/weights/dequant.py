"""Block-wise FP8 (e4m3fn) -> BF16 dequantisation, vectorised, plus the float32 reference.

DeepSeek-V3 stores each quantised linear weight ``W`` ([M, N] float8_e4m3fn) with ``W_scale_inv``
([ceil(M/bm), ceil(N/bn)] float32, block (bm, bn) = (128, 128)); the real weight is
``W[i, j] * scale_inv[i // bm, j // bn]``. Edge blocks are ragged when M or N is not a multiple of the
block size.

Why not simply ``W.float() * scale``: torch's CPU float8 -> float32 cast is a scalar loop (about 0.1 G
elements/s here) and the naive path also materialises the repeat-interleaved scale at full size. Instead:

* the fp8 bits are widened as int8 -> int32 (a vectorised integer copy) and moved into float32 position
  with one shift and one mask: ``bits = (x << 20) & 0x87F00000``. Read as float32 this is exactly
  ``value * 2**-120`` for normal *and* subnormal fp8 numbers (float32's exponent bias is 120 above
  e4m3's), so folding ``2**120`` into the scale gives the exact float32 product ``value * scale``:
  the result is bit-identical to the float32 reference rounded to BF16;
* the scale is expanded along columns only (``[ceil(M/bm), N]``, 1/bm of the weight), so ragged
  column blocks need no special case, and broadcast over the rows of each block;
* the work goes through row stripes of a few MB so the int32/float32 temporaries stay in cache and
  peak extra memory is one stripe, not 4 bytes per weight element. The stripes are a cache tiling
  (a handful per tensor), not a loop over 128x128 blocks.

FP8 NaN encodings (0x7F/0xFF) have no finite meaning in a weight; they raise ``ValueError``, as does a
non-finite scale (NaN or inf; every weight of its block would be NaN or inf), a scale that is zero or
negative (its block would silently become zeros or flip sign), a scale outside `SCALE_INV_RANGE` and a
result that overflows the output dtype: a checkpoint never silently becomes zeroed, absurd or non-finite
weights, ``--verify`` or not.

The plausible range of a ``weight_scale_inv``. It is the block's largest weight over the largest e4m3 value:
``scale_inv = amax / 448`` (DeepSeek-V3's README: the weight is the FP8 block times ``weight_scale_inv``;
DeepSeek's DeepGEMM builds its test weights with ``per_block_cast_to_fp8``, which clamps ``amax`` at 1e-4, so
an all-zero block gets 1e-4 / 448 = 2.2e-7 rather than zero). So:

* floor 2**-24 (6.0e-8), about a quarter of that smallest value: below it every weight of the block is under
  448 * 2**-24 = 2.7e-5 in magnitude, under 1/200 of the 0.006 standard deviation DeepSeek-V3's weights are
  initialised with, i.e. a block of (near) zeros that this quantiser cannot write; 1e-45 (a float32
  subnormal) zeroes the block in BF16 as a zero scale would;
* ceiling 1.0: weights up to 448 in magnitude. Trained LLM linear weights are of order 1e-2 to 1 (the largest
  outliers a few units), so real scales are of order 1e-5 to 1e-2; 1.0 leaves two orders of magnitude of
  headroom, and 1e30 (weights up to 4.5e32) is refused. It also keeps ``scale * 2**120`` (the kernel's
  rebias) finite in float32.

The checkpoint itself (700 GB) was not read to set these: they come from the format, the quantiser and the
weight magnitudes above, with wide margins. A real scale outside them would be refused by name, not
converted: the bound shows itself rather than passing a wrong weight.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

DEFAULT_BLOCK = (128, 128)
FP8_DTYPES = (torch.float8_e4m3fn,)
_REBIAS = 2.0**120  # float32 exponent bias (127) minus e4m3 bias (7)
_MASK_SIGN_EXP_MANT = -0x78100000  # int32 view of 0x87F00000: sign bit + 4 exponent + 3 mantissa bits
_STRIPE_ELEMS = 1 << 22  # about 16 MB of float32 temporaries per stripe
SCALE_INV_RANGE = (2.0**-24, 1.0)  # a weight_scale_inv outside it is refused; why these bounds: module docstring


def scale_grid_shape(shape: tuple[int, int] | torch.Size, block: tuple[int, int] = DEFAULT_BLOCK) -> tuple[int, int]:
    """Shape of the scale tensor of a weight of ``shape`` (ceil-divided by the block)."""
    m, n = shape
    bm, bn = block
    return (-(-m // bm), -(-n // bn))


def first_non_finite(t: torch.Tensor) -> tuple[tuple[int, ...], float] | None:
    """(index, value) of the first NaN or inf element of a floating tensor, or None when all are finite."""
    if not t.is_floating_point() or t.numel() == 0:
        return None
    bad = ~torch.isfinite(t)
    if not bool(bad.any()):
        return None
    flat = int(bad.reshape(-1).to(torch.uint8).argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(t.shape)))
    return index, float(t.reshape(-1)[flat])


def _check(weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int]) -> None:
    if weight.dtype not in FP8_DTYPES:
        raise ValueError(f"weight dtype {weight.dtype} is not float8_e4m3fn")
    if weight.dim() != 2:
        raise ValueError(f"block dequantisation needs a 2-D weight, got shape {tuple(weight.shape)}")
    want = scale_grid_shape(weight.shape, block)
    if tuple(scale_inv.shape) != want:
        raise ValueError(
            f"scale shape {tuple(scale_inv.shape)} does not match weight {tuple(weight.shape)} "
            f"with block {block}: expected {want}"
        )
    bad = first_non_finite(scale_inv)
    if bad is not None:
        raise ValueError(f"its scale holds a non-finite value ({bad[1]}) at block {bad[0]}")
    if scale_inv.numel() and bool((scale_inv <= 0).any()):  # DeepSeek's weight_scale_inv is always positive:
        flat = int((scale_inv <= 0).reshape(-1).to(torch.uint8).argmax())  # zero would zero a block, < 0 negate it
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(scale_inv.shape)))
        raise ValueError(
            f"its scale holds a non-positive value ({float(scale_inv.reshape(-1)[flat])}) at block "
            f"{index}; a scale must be finite and positive"
        )
    lo, hi = SCALE_INV_RANGE
    outside = (scale_inv.float() < lo) | (scale_inv.float() > hi)
    if scale_inv.numel() and bool(outside.any()):
        flat = int(outside.reshape(-1).to(torch.uint8).argmax())
        index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), tuple(scale_inv.shape)))
        value = float(scale_inv.reshape(-1)[flat])
        raise ValueError(
            f"its scale holds {value:.3g} at block {index}, outside the plausible range [{lo:.3g}, {hi:g}] of "
            f"DeepSeek-V3's weight_scale_inv (the block's largest weight / 448: its weights would be at most "
            f"{448 * value:.3g} in magnitude)"
        )


def _check_result(out: torch.Tensor) -> torch.Tensor:
    bad = first_non_finite(out)
    if bad is not None:
        raise ValueError(
            f"the dequantised weight is not finite ({bad[1]}) at {bad[0]}: weight x scale overflows {out.dtype}"
        )
    return out


@contextlib.contextmanager
def _denormals_preserved() -> Iterator[None]:
    """Subnormal fp8 values become float32 subnormals on the way; flush-to-zero would zero them."""
    flushed = bool((torch.tensor([2.0**-140]) * 2.0).item() == 0.0)
    if flushed:
        torch.set_flush_denormal(False)
    try:
        yield
    finally:
        if flushed:
            torch.set_flush_denormal(True)


def dequantize_fp8_reference(
    weight: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK
) -> torch.Tensor:
    """The naive float32 result: ``W.float() * repeat_interleave(scale)`` (used to verify and as baseline)."""
    _check(weight, scale_inv, block)
    m, n = weight.shape
    bm, bn = block
    full = scale_inv.float().repeat_interleave(bm, dim=0).repeat_interleave(bn, dim=1)[:m, :n]
    return _check_result(weight.float() * full)


class Workspace:
    """Reusable output and scratch memory for a sequence of dequantisations (one per worker).

    Fresh multi-MB allocations are returned to the OS on free and page-faulted in again on first touch,
    which costs about a quarter of the kernel's time; a converter that writes each result out before the
    next call can reuse one buffer instead. A result returned with a workspace is only valid until the
    next call with the same workspace.
    """

    def __init__(self) -> None:
        self._out = torch.empty(0, dtype=torch.uint8)
        self._scratch = torch.empty(0, dtype=torch.int32)

    def out(self, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        n = shape[0] * shape[1] * torch.empty((), dtype=dtype).element_size()
        if self._out.numel() < n:
            self._out = torch.empty(n, dtype=torch.uint8)
        return self._out[:n].view(dtype).view(shape)

    def scratch(self, shape: tuple[int, int]) -> torch.Tensor:
        n = shape[0] * shape[1]
        if self._scratch.numel() < n:
            self._scratch = torch.empty(n, dtype=torch.int32)
        return self._scratch[:n].view(shape)


def dequantize_fp8_blockwise(
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = DEFAULT_BLOCK,
    out_dtype: torch.dtype = torch.bfloat16,
    workspace: Workspace | None = None,
) -> torch.Tensor:
    """``round(W * scale_inv)`` over (bm, bn) blocks, equal bit for bit to the reference cast to ``out_dtype``."""
    _check(weight, scale_inv, block)
    m, n = weight.shape
    bm, _ = block
    raw = weight.contiguous().view(torch.int8)
    # 0x7F is the largest int8 and 0xFF the largest uint8: two fast reductions find any NaN code
    if raw.numel() and (int(raw.max()) == 0x7F or int(raw.view(torch.uint8).max()) == 0xFF):
        raise ValueError("weight contains FP8 NaN encodings (0x7F/0xFF)")
    scale = scale_inv.to(torch.float32)  # at most 1 (SCALE_INV_RANGE): times the rebias, still finite
    col_scale = (scale * _REBIAS).repeat_interleave(block[1], dim=1)[:, :n].contiguous()  # [gm, n]

    full_rows = (m // bm) * bm
    blocks_per_stripe = max(1, _STRIPE_ELEMS // max(1, bm * n))
    stripe_rows = blocks_per_stripe * bm
    if workspace is None:
        out = torch.empty((m, n), dtype=out_dtype)
        buf = torch.empty((min(stripe_rows, m), n), dtype=torch.int32)
    else:
        out = workspace.out((m, n), out_dtype)
        buf = workspace.scratch((min(stripe_rows, m), n))

    def convert(r0: int, r1: int) -> None:
        rows = r1 - r0
        b = buf[:rows]
        b.copy_(raw[r0:r1])  # sign-extending int8 -> int32
        b.bitwise_left_shift_(20).bitwise_and_(_MASK_SIGN_EXP_MANT)
        f = b.view(torch.float32)
        b0 = r0 // bm
        if rows % bm == 0:
            f.view(rows // bm, bm, n).mul_(col_scale[b0 : b0 + rows // bm, None, :])
        else:  # the ragged last row block
            f.mul_(col_scale[b0][None, :])
        out[r0:r1].copy_(f)

    with _denormals_preserved():
        for r0 in range(0, full_rows, stripe_rows):
            convert(r0, min(r0 + stripe_rows, full_rows))
        if full_rows < m:
            convert(full_rows, m)
    return _check_result(out)
