"""Block-wise FP8 dequantisation against the dense float32 reference (J1)."""

from __future__ import annotations

import pytest
import torch

from verl_patches.weights.dequant import dequantize_fp8_blockwise, dequantize_fp8_reference, scale_grid_shape


def _fp8(shape, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * spread).to(torch.float8_e4m3fn)


def _scale(shape, block, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(scale_grid_shape(shape, block), generator=g) * 1e-2 + 1e-4


def _dense_reference(w, s, block):
    """Independent oracle: one multiply per element with its own block's scale."""
    m, n = w.shape
    rows = torch.arange(m) // block[0]
    cols = torch.arange(n) // block[1]
    return w.float() * s[rows][:, cols]


def test_vendor_case_300x200_matches_dense_reference():
    w, s = _fp8((300, 200)), _scale((300, 200), (128, 128))
    assert s.shape == (3, 2)
    ref = _dense_reference(w, s, (128, 128))
    out = dequantize_fp8_blockwise(w, s)
    assert out.dtype == torch.bfloat16 and out.shape == (300, 200)
    assert torch.equal(out, ref.to(torch.bfloat16))  # the same float32 product, rounded once
    assert ((out.float() - ref).abs() <= ref.abs() * 2**-8).all()
    assert torch.equal(dequantize_fp8_reference(w, s), ref)


@pytest.mark.parametrize(
    "shape,block",
    [
        ((128, 128), (128, 128)),
        ((129, 127), (128, 128)),
        ((1, 1), (128, 128)),
        ((576, 7168 // 8), (128, 128)),
        ((4096, 896), (128, 128)),  # several row stripes
        ((70, 33), (16, 8)),
        ((5, 300), (4, 128)),
    ],
)
def test_shapes_and_ragged_edges(shape, block):
    w, s = _fp8(shape, seed=shape[0]), _scale(shape, block, seed=shape[1])
    assert torch.equal(dequantize_fp8_blockwise(w, s, block), _dense_reference(w, s, block).to(torch.bfloat16))


def test_every_fp8_bit_pattern_including_subnormals_and_signed_zero():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F]  # all 254 non-NaN encodings
    w = codes.view(torch.float8_e4m3fn).reshape(2, 127)
    s = torch.tensor([[0.37]])
    out = dequantize_fp8_blockwise(w, s)
    ref = (w.float() * 0.37).to(torch.bfloat16)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))  # bitwise, so -0.0 is checked too


def test_flush_denormal_mode_is_handled_and_restored():
    w = torch.tensor([[1, 2, 3, 0x81]], dtype=torch.uint8).view(torch.float8_e4m3fn)  # fp8 subnormals
    s = torch.tensor([[0.5]])
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        out = dequantize_fp8_blockwise(w, s)
        still_flushing = (torch.tensor([2.0**-140]) * 2.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)
    assert still_flushing
    torch.testing.assert_close(out.float(), torch.tensor([[2**-10, 2**-9, 3 * 2**-10, -(2**-10)]]), rtol=0, atol=0)


def test_errors():
    w = _fp8((10, 10))
    with pytest.raises(ValueError, match="expected \\(1, 1\\)"):
        dequantize_fp8_blockwise(w, torch.ones(2, 1))
    with pytest.raises(ValueError, match="not float8"):
        dequantize_fp8_blockwise(w.float(), torch.ones(1, 1))
    bad = w.clone()
    bad.view(torch.uint8)[3, 4] = 0x7F
    with pytest.raises(ValueError, match="NaN"):
        dequantize_fp8_blockwise(bad, torch.ones(1, 1))
    bad.view(torch.uint8)[3, 4] = 0xFF
    with pytest.raises(ValueError, match="NaN"):
        dequantize_fp8_blockwise(bad, torch.ones(1, 1))


def test_workspace_reuse_across_shapes():
    from verl_patches.weights.dequant import Workspace

    ws = Workspace()
    for i, shape in enumerate([(300, 200), (1000, 130), (5, 7), (640, 2048)]):
        w, s = _fp8(shape, seed=i), _scale(shape, (128, 128), seed=i + 10)
        got = dequantize_fp8_blockwise(w, s, workspace=ws)
        assert torch.equal(got, _dense_reference(w, s, (128, 128)).to(torch.bfloat16)), shape
