"""Each emulated torch_npu / MindSpeed op against an independent reference formula, forward and backward."""

from __future__ import annotations

import math

import pytest
import torch

from verl_patches.npu_emulation.ops import activation, attention, gmm, moe, norm, optim, rotary, softmax

D64 = torch.float64


def rand(*shape, dtype=D64, grad=True, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else hash(shape) % 10000)
    t = torch.randn(*shape, generator=g, dtype=dtype)
    return t.requires_grad_(grad)


# ---- RMSNorm ---------------------------------------------------------------------------------
def test_rms_norm_matches_formula_and_returns_rstd():
    x, w = rand(3, 5, 8), rand(8)
    y, rstd = norm.npu_rms_norm(x, w, epsilon=1e-5)
    ref_rstd = 1.0 / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(rstd, ref_rstd)
    torch.testing.assert_close(y, x * ref_rstd * w)


def test_rms_norm_gradcheck():
    x, w = rand(2, 3, 6), rand(6)
    assert torch.autograd.gradcheck(lambda a, b: norm.npu_rms_norm(a, b, 1e-6)[0], (x, w))


def test_rms_norm_half_precision_computes_in_fp32():
    x, w = rand(4, 16, dtype=torch.float32, grad=False), rand(16, dtype=torch.float32, grad=False)
    y, _ = norm.npu_rms_norm(x.bfloat16(), w.bfloat16())
    ref = (
        x.bfloat16().float()
        * torch.rsqrt(x.bfloat16().float().pow(2).mean(-1, keepdim=True) + 1e-6)
        * w.bfloat16().float()
    ).bfloat16()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y, ref)


# ---- SwiGLU ----------------------------------------------------------------------------------
def test_swiglu_forward_and_explicit_backward():
    x = rand(4, 10)
    y = activation.npu_swiglu(x, dim=-1)
    a, b = x[:, :5], x[:, 5:]
    torch.testing.assert_close(y, a * torch.sigmoid(a) * b)
    g = rand(4, 5, grad=False)
    (auto,) = torch.autograd.grad(y, x, g)
    torch.testing.assert_close(activation.npu_swiglu_backward(g, x.detach(), dim=-1), auto)


def test_swiglu_gradcheck_other_dim():
    assert torch.autograd.gradcheck(lambda t: activation.npu_swiglu(t, dim=0), (rand(6, 3),))


# ---- rotary ----------------------------------------------------------------------------------
def _rope_reference(x, theta, interleaved):
    """Rotation of each pair by its angle, via complex multiplication."""
    d = x.shape[-1]
    if interleaved:
        pairs = x.reshape(*x.shape[:-1], d // 2, 2)
        z = torch.complex(pairs[..., 0], pairs[..., 1]) * torch.polar(torch.ones_like(theta), theta)
        return torch.stack((z.real, z.imag), -1).reshape(x.shape)
    z = torch.complex(x[..., : d // 2], x[..., d // 2 :]) * torch.polar(torch.ones_like(theta), theta)
    return torch.cat((z.real, z.imag), -1)


@pytest.mark.parametrize("mode", [0, 1])
def test_rotary_position_embedding_is_a_rotation(mode):
    s, d = 5, 8
    x = rand(2, s, 3, d)
    theta = torch.rand(s, 1, d // 2, dtype=D64) * 3
    if mode == 0:
        freqs = torch.cat((theta, theta), -1)
    else:
        freqs = theta.repeat_interleave(2, -1)
    out = rotary.npu_rotary_position_embedding(x, freqs.cos(), freqs.sin(), mode)
    torch.testing.assert_close(out, _rope_reference(x, theta, interleaved=mode == 1))
    assert torch.autograd.gradcheck(
        lambda t: rotary.npu_rotary_position_embedding(t, freqs.cos(), freqs.sin(), mode), (rand(1, s, 1, d),)
    )


def test_rotary_rejects_unknown_mode_and_rotary_mul_is_mode_0():
    x, c, s = rand(1, 2, 1, 4, grad=False), rand(1, 2, 1, 4, grad=False), rand(1, 2, 1, 4, grad=False)
    with pytest.raises(ValueError, match="mode"):
        rotary.npu_rotary_position_embedding(x, c, s, 2)
    torch.testing.assert_close(rotary.npu_rotary_mul(x, c, s), rotary.npu_rotary_position_embedding(x, c, s, 0))


# ---- flash attention -------------------------------------------------------------------------
def _sdpa(q, k, v, mask_true_is_masked, scale):
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) * scale
    scores = scores.masked_fill(mask_true_is_masked, float("-inf"))
    return torch.softmax(scores, -1) @ v


def test_fusion_attention_bnsd_with_mask_matches_softmax_formula():
    b, n, s, d, dv = 2, 4, 6, 8, 5  # MLA-like: value head dim differs
    q, k, v = rand(b, n, s, d), rand(b, n, s, d), rand(b, n, s, dv)
    mask = torch.ones(s, s, dtype=torch.bool).triu(1).expand(b, 1, s, s)
    scale = 1 / math.sqrt(d)
    out, mx, sm, *_ = attention.npu_fusion_attention(q, k, v, n, "BNSD", atten_mask=mask, scale=scale)
    torch.testing.assert_close(out, _sdpa(q, k, v, mask, scale))
    assert mx.shape == (b, n, s, 8) and sm.shape == (b, n, s, 8)
    assert torch.autograd.gradcheck(
        lambda a, bb, c: attention.npu_fusion_attention(a, bb, c, n, "BNSD", atten_mask=mask, scale=scale)[0],
        (rand(1, 2, 4, 3), rand(1, 2, 4, 3), rand(1, 2, 4, 2)),
        eps=1e-6,
    )


@pytest.mark.parametrize("layout", ["BSH", "SBH", "BSND"])
def test_fusion_attention_layouts_agree_with_bnsd(layout):
    b, n, s, d = 2, 2, 5, 4
    q, k, v = rand(b, n, s, d, grad=False), rand(b, n, s, d, grad=False), rand(b, n, s, d, grad=False)
    ref = attention.npu_fusion_attention(q, k, v, n, "BNSD", scale=0.3, sparse_mode=2)[0]
    conv = {
        "BSH": lambda t: t.transpose(1, 2).reshape(b, s, n * d),
        "SBH": lambda t: t.permute(2, 0, 1, 3).reshape(s, b, n * d),
        "BSND": lambda t: t.transpose(1, 2),
    }[layout]
    out = attention.npu_fusion_attention(conv(q), conv(k), conv(v), n, layout, scale=0.3, sparse_mode=2)[0]
    torch.testing.assert_close(out, conv(ref))


def test_fusion_attention_gqa_and_sparse_modes():
    b, n, nkv, sq, skv, d = 1, 4, 2, 3, 5, 4
    q, k, v = rand(b, n, sq, d, grad=False), rand(b, nkv, skv, d, grad=False), rand(b, nkv, skv, d, grad=False)
    i, j = torch.arange(sq).view(-1, 1), torch.arange(skv).view(1, -1)
    cases = {2: j > i, 3: j > i + (skv - sq)}
    for mode, masked in cases.items():
        out = attention.npu_fusion_attention(q, k, v, n, "BNSD", scale=0.5, sparse_mode=mode)[0]
        torch.testing.assert_close(out, _sdpa(q, k, v, masked.view(1, 1, sq, skv), 0.5))
    band = attention.npu_fusion_attention(q, k, v, n, "BNSD", scale=0.5, pre_tockens=1, next_tockens=0)[0]
    torch.testing.assert_close(band, _sdpa(q, k, v, ((j > i) | (j < i - 1)).view(1, 1, sq, skv), 0.5))


def test_fusion_attention_fully_masked_row_is_zero_and_finite():
    q, k, v = rand(1, 1, 2, 4), rand(1, 1, 2, 4), rand(1, 1, 2, 4)
    mask = torch.tensor([[True, True], [False, True]]).view(1, 1, 2, 2)
    out = attention.npu_fusion_attention(q, k, v, 1, "BNSD", atten_mask=mask, scale=1.0)[0]
    assert torch.equal(out[0, 0, 0], torch.zeros(4, dtype=D64))
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


def test_fusion_attention_tnd_is_per_sequence():
    n, d = 2, 4
    q, k, v = rand(7, n, d, grad=False), rand(7, n, d, grad=False), rand(7, n, d, grad=False)
    out = attention.npu_fusion_attention(
        q, k, v, n, "TND", scale=0.5, sparse_mode=3, actual_seq_qlen=[3, 7], actual_seq_kvlen=[3, 7]
    )[0]
    for a, bnd in ((0, 3), (3, 7)):
        part = attention.npu_fusion_attention(
            q[a:bnd].transpose(0, 1)[None],
            k[a:bnd].transpose(0, 1)[None],
            v[a:bnd].transpose(0, 1)[None],
            n,
            "BNSD",
            scale=0.5,
            sparse_mode=3,
        )[0]
        torch.testing.assert_close(out[a:bnd], part[0].transpose(0, 1))


def test_fusion_attention_grad_equals_autograd():
    q, k, v = rand(1, 2, 4, 3), rand(1, 2, 4, 3), rand(1, 2, 4, 3)
    dy = rand(1, 2, 4, 3, grad=False)
    out = attention.npu_fusion_attention(q, k, v, 2, "BNSD", scale=0.7, sparse_mode=2)[0]
    ref = torch.autograd.grad(out, (q, k, v), dy)
    dq, dk, dv, _ = attention.npu_fusion_attention_grad(q, k, v, dy, 2, "BNSD", scale_value=0.7, sparse_mode=2)
    for a, b in zip((dq, dk, dv), ref):
        torch.testing.assert_close(a, b)


def test_fusion_attention_refuses_dropout():
    q = rand(1, 1, 2, 2, grad=False)
    with pytest.raises(NotImplementedError, match="keep_prob"):
        attention.npu_fusion_attention(q, q, q, 1, "BNSD", keep_prob=0.9)


# ---- MoE permute / unpermute -----------------------------------------------------------------
def test_token_permute_groups_copies_by_expert_stably():
    tokens = rand(4, 3)
    indices = torch.tensor([[2, 0], [0, 1], [2, 1], [0, 2]])
    permuted, sorted_idx = moe.npu_moe_token_permute(tokens, indices)
    expected_rows = [t for e in range(3) for t in range(4) for k in range(2) if indices[t, k] == e]
    torch.testing.assert_close(permuted, tokens[expected_rows])
    assert sorted_idx.tolist() == sorted(range(8), key=lambda r: (indices.view(-1)[r].item(), r))


def test_token_unpermute_inverts_permute_with_probs_and_gradchecks():
    tokens = rand(5, 4)
    indices = torch.tensor([[1, 0], [0, 2], [2, 1], [1, 2], [0, 1]])
    probs = torch.rand(5, 2, dtype=D64, requires_grad=True)
    permuted, sorted_idx = moe.npu_moe_token_permute(tokens, indices)
    out = moe.npu_moe_token_unpermute(permuted, sorted_idx, probs)
    torch.testing.assert_close(out, tokens * probs.sum(1, keepdim=True))
    assert torch.autograd.gradcheck(
        lambda t, p: moe.npu_moe_token_unpermute(moe.npu_moe_token_permute(t, indices)[0], sorted_idx, p),
        (tokens, probs),
    )


def test_token_permute_num_out_tokens_drops_the_tail():
    tokens = rand(3, 2, grad=False)
    indices = torch.tensor([[1], [0], [1]])
    permuted, sorted_idx = moe.npu_moe_token_permute(tokens, indices, num_out_tokens=2)
    assert permuted.shape[0] == 2 and sorted_idx.tolist() == [1, 0]


# ---- grouped matmul --------------------------------------------------------------------------
def _gmm_ref(x, w, counts):
    outs, a = [], 0
    for e, c in enumerate(counts):
        outs.append(x[a : a + c] @ w[e])
        a += c
    return torch.cat(outs)


@pytest.mark.parametrize("group_list_type", [0, 1])
def test_gmm_forward_backward_and_fused_weight_grad(group_list_type):
    counts = [2, 0, 3]
    x, w = rand(5, 4), rand(3, 4, 6)
    group_list = torch.tensor(counts if group_list_type == 1 else list(torch.tensor(counts).cumsum(0)))
    (y,) = gmm.npu_gmm([x], [w], [], group_list, 0, group_list_type)
    ref = _gmm_ref(x, w, counts)
    torch.testing.assert_close(y, ref)
    dy = rand(5, 6, grad=False)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, w), dy)
    dx, dw, _ = gmm.npu_gmm_backward([dy], [x.detach()], [w.detach()], group_list, group_list_type)
    torch.testing.assert_close(dx[0], ref_dx)
    torch.testing.assert_close(dw[0], ref_dw)
    dx2, _, _ = gmm.npu_gmm_backward_fusion([dy], [w.detach()], group_list, group_list_type)
    torch.testing.assert_close(dx2[0], ref_dx)
    main_grad = torch.ones(3 * 4, 6, dtype=torch.float32)
    cumulative = torch.tensor(counts).cumsum(0)
    gmm.npu_groupmatmul_add_fp32(x.detach(), dy, cumulative, main_grad)
    torch.testing.assert_close(main_grad, (1 + ref_dw.reshape(12, 6)).float())


def test_gmm_gradcheck_through_autograd():
    group_list = torch.tensor([1, 3])
    assert torch.autograd.gradcheck(
        lambda a, b: gmm.npu_gmm([a], [b], [], group_list, 0, 0)[0], (rand(3, 2), rand(2, 2, 3))
    )


def test_gmm_rejects_a_group_list_that_does_not_fit():
    with pytest.raises(ValueError, match="entries"):
        gmm.npu_gmm([rand(3, 2)], [rand(2, 2, 2)], [], torch.tensor([3]), 0, 0)
    with pytest.raises(ValueError, match="does not split"):
        gmm.npu_gmm([rand(3, 2)], [rand(2, 2, 2)], [], torch.tensor([2, 5]), 0, 0)


def test_matmul_add_fp32_accumulates_dense_weight_grad():
    x, dy = rand(2, 3, 4, grad=False), rand(2, 3, 5, grad=False)
    grad = torch.zeros(5, 4, dtype=torch.float32)
    gmm.npu_matmul_add_fp32(dy, x, grad)
    torch.testing.assert_close(grad, (dy.reshape(6, 5).t() @ x.reshape(6, 4)).float())


# ---- AdamW -----------------------------------------------------------------------------------
@pytest.mark.parametrize("maximize", [False, True])
def test_apply_adam_w_equals_torch_adamw_over_steps(maximize):
    lr, wd, b1, b2, eps = 1e-2, 0.1, 0.9, 0.95, 1e-8
    p_ref = rand(7, grad=False).clone().requires_grad_(True)
    opt = torch.optim.AdamW([p_ref], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, maximize=maximize)
    p, m, v = p_ref.detach().clone(), torch.zeros(7, dtype=D64), torch.zeros(7, dtype=D64)
    for step in range(1, 5):
        g = rand(7, grad=False, seed=step)
        p_ref.grad = g.clone()
        opt.step()
        optim.npu_apply_adam_w(
            b1 ** (step - 1), b2 ** (step - 1), lr, wd, b1, b2, eps, g, None, False, maximize, out=(p, m, v)
        )
        torch.testing.assert_close(p, p_ref.detach())


# ---- scaled masked softmax -------------------------------------------------------------------
def test_scaled_masked_softmax():
    x = rand(2, 1, 3, 3, grad=False)
    mask = torch.ones(3, 3, dtype=torch.bool).triu(1).view(1, 1, 3, 3)
    out = softmax.npu_scaled_masked_softmax(x, mask, scale=2.0)
    torch.testing.assert_close(out, torch.softmax((x * 2).masked_fill(mask, -10000.0), -1))
    torch.testing.assert_close(softmax.npu_scaled_masked_softmax(x, None, 2.0, fixed_triu_mask=True), out)


@pytest.mark.parametrize("amsgrad, maximize", [(False, False), (True, False), (False, True)])
def test_fused_adamw_v2_equals_torch_adamw(amsgrad, maximize):
    lr, wd, b1, b2, eps = 1e-2, 0.1, 0.9, 0.95, 1e-8
    p_ref = rand(6, grad=False).clone().requires_grad_(True)
    opt = torch.optim.AdamW(
        [p_ref], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, amsgrad=amsgrad, maximize=maximize
    )
    p, m, v, mx = (
        p_ref.detach().clone(),
        torch.zeros(6, dtype=D64),
        torch.zeros(6, dtype=D64),
        torch.zeros(6, dtype=D64),
    )
    for step in range(1, 5):
        g = rand(6, grad=False, seed=10 + step)
        p_ref.grad = g.clone()
        opt.step()
        optim.npu_apply_fused_adamw_v2(p, g, m, v, mx, torch.tensor(step), lr, b1, b2, wd, eps, amsgrad, maximize)
        torch.testing.assert_close(p, p_ref.detach())
