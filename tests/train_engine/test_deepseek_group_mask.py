"""DeepSeek-V3's group-limited routing, one rule for training, rollout and the reference.

DeepSeek-V3's own inference code (deepseek-ai/DeepSeek-V3 inference/model.py, class `Gate`) masks the experts
of the groups it did not keep with -inf; transformers 4.52.4 fills them with 0.0. With sigmoid scores and a
negative score-correction bias the biased scores are negative, and a 0.0 fill then chooses experts of groups
that were not selected. On tokens where that happens, with the tiny run's router (256 experts, 8 groups, the
top 8 of the 4 best groups) and its bias distribution, these choose the same experts with the same weights:

* `deepseek_gate` below, DeepSeek's Gate written out from its source (sigmoid, bias for the choice, group score
  = top-2 sum with a bias / max without, -inf mask, top-k, weights = unbiased scores / their sum x route scale);
* transformers' `DeepseekV3TopkRouter` with the declared patch (`transformers.deepseek_v3.router_masks_
  unselected_groups`), and NOT without it (the test fails without the patch);
* MindSpeed-LLM's training router (`topk_softmax_with_capacity`, its noaux_tc branch, as TopKRouter calls it);
* ``torch_npu.npu_moe_gating_top_k`` (emulated) with the arguments vllm-ascend's 256-expert branch passes, its
  weights times routed_scaling_factor as vllm-ascend's DeepSeek MoE applies it;
* vllm-ascend's `select_experts` (its branch below 256 experts) with the declared patch, and NOT without it.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.cpu_proof.tiny_a3 import ROUTER_BIAS_MEAN, ROUTER_BIAS_STD
from verl_patches.multirank import run_ranks
from verl_patches.npu_emulation.ops.moe_routing import npu_moe_gating_top_k
from verl_patches.patches.transformers.deepseek_v3_router import group_limited_top_k

EXPERTS, GROUPS, TOPK_GROUPS, TOPK, SCALE = 256, 8, 4, 8, 2.5  # DeepSeek-V3's router (the tiny run's)
HIDDEN, TOKENS = 64, 12
HF_PATCH = "transformers.deepseek_v3.router_masks_unselected_groups"
VLLM_ASCEND_PATCH = "vllm_ascend.fused_moe.grouped_topk_as_deepseek"


def deepseek_gate(logits, bias, groups, topk_groups, topk, route_scale):
    """DeepSeek-V3's Gate.forward from its logits on (sigmoid scoring): (weights, indices)."""
    scores = logits.sigmoid()
    original = scores
    if bias is not None:
        scores = scores + bias
    if groups > 1:
        per_group = scores.view(logits.size(0), groups, -1)
        group_scores = per_group.amax(dim=-1) if bias is None else per_group.topk(2, dim=-1)[0].sum(dim=-1)
        keep = group_scores.topk(topk_groups, dim=-1)[1]
        drop = per_group.new_ones(logits.size(0), groups, dtype=torch.bool).scatter_(1, keep, False)
        scores = per_group.masked_fill(drop.unsqueeze(-1), float("-inf")).flatten(1)
    indices = torch.topk(scores, topk, dim=-1)[1]
    weights = original.gather(1, indices)
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights * route_scale, indices


def zero_filled_choice(logits, bias, groups, topk_groups, topk):
    """The same choice with the unselected groups at 0.0 (transformers 4.52.4, DeepSeek before its fix)."""
    biased = (logits.sigmoid() + bias).view(logits.size(0), groups, -1)
    keep = biased.topk(2, dim=-1)[0].sum(dim=-1).topk(topk_groups, dim=-1)[1]
    kept = torch.zeros(logits.size(0), groups, dtype=torch.bool).scatter_(1, keep, True)
    return biased.masked_fill(~kept.unsqueeze(-1), 0.0).flatten(1).topk(topk, dim=-1)[1]


def router_case(seed: int = 0) -> dict[str, torch.Tensor]:
    """Hidden states, a gate weight and the tiny run's bias distribution (N(ROUTER_BIAS_MEAN, STD^2))."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=g)
    weight = torch.randn(EXPERTS, HIDDEN, generator=g) * 0.1  # logits ~ N(0, 0.8^2): sigmoid scores over (0, 1)
    bias = ROUTER_BIAS_MEAN + ROUTER_BIAS_STD * torch.randn(EXPERTS, generator=g)
    return {"hidden": hidden, "weight": weight, "bias": bias, "logits": torch.nn.functional.linear(hidden, weight)}


def by_expert(weights: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(indices, weights) of each token in expert order: implementations list the chosen experts differently."""
    order = indices.long().argsort(dim=-1)
    return indices.long().gather(1, order), weights.double().gather(1, order)


def groups_of(indices: torch.Tensor) -> list[set[int]]:
    return [{int(e) // (EXPERTS // GROUPS) for e in row} for row in indices]


# ---- the rule, in this process ---------------------------------------------------------------------------------
def test_the_cases_tokens_have_negative_biased_scores_where_the_two_masks_choose_differently() -> None:
    case = router_case()
    biased = case["logits"].sigmoid() + case["bias"]
    # fewer positive biased scores than experts to choose: a 0.0 fill then outranks a chosen expert
    assert bool(((biased > 0).sum(dim=-1) < TOPK).all())
    _, deepseek = deepseek_gate(case["logits"], case["bias"], GROUPS, TOPK_GROUPS, TOPK, SCALE)
    zero = zero_filled_choice(case["logits"], case["bias"], GROUPS, TOPK_GROUPS, TOPK)
    for t in range(TOKENS):
        assert set(zero[t].tolist()) != set(deepseek[t].tolist()), t
        assert len(groups_of(deepseek[t : t + 1])[0]) <= TOPK_GROUPS
        assert len(groups_of(zero[t : t + 1])[0]) > TOPK_GROUPS or groups_of(zero[t : t + 1]) != groups_of(
            deepseek[t : t + 1]
        )


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    tokens=st.integers(1, 6),
    groups=st.sampled_from([1, 2, 4, 8]),
    per_group=st.integers(2, 6),
    data=st.data(),
    offset=st.sampled_from([0.0, -0.5, -1.0, 0.3]),
)
def test_the_patch_rule_and_the_kernel_choose_as_deepseeks_gate(seed, tokens, groups, per_group, data, offset) -> None:
    topk_groups = data.draw(st.integers(1, groups))
    topk = data.draw(st.integers(1, topk_groups * per_group))
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, groups * per_group, generator=g, dtype=torch.float64)
    bias = offset + 0.1 * torch.randn(groups * per_group, generator=g, dtype=torch.float64)
    weights, want = deepseek_gate(logits, bias, groups, topk_groups, topk, SCALE)
    got = group_limited_top_k(logits.sigmoid() + bias, groups, topk_groups, topk, group_by_top2=True)
    assert torch.equal(by_expert(weights, got)[0], by_expert(weights, want)[0])
    # the emulated kernel as vllm-ascend calls it (sigmoid, top-2 group score, no renorm, scale 1)
    y, ids, norm = npu_moe_gating_top_k(
        logits.float(), topk, bias=bias.float(), k_group=topk_groups, group_count=groups, group_select_mode=1,
        renorm=0, norm_type=1, routed_scaling_factor=1, eps=1e-20,
    )  # fmt: skip
    assert ids.dtype == torch.int32 and norm.dtype == torch.float32
    want_ids, want_w = by_expert(weights, want)
    got_ids, got_w = by_expert(y * SCALE, ids)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, rtol=1e-5, atol=1e-6)


def test_the_kernel_renormalises_softmax_only_when_asked_and_sigmoid_always() -> None:
    """aclnnMoeGatingTopK: renorm acts with softmax (norm_type 0) and has no effect with sigmoid."""
    g = torch.Generator().manual_seed(3)
    x, bias = torch.randn(5, 32, generator=g), 0.1 * torch.randn(32, generator=g)
    kw = dict(bias=bias, k_group=2, group_count=4, group_select_mode=1, routed_scaling_factor=2.0)
    plain, ids0, norm = npu_moe_gating_top_k(x, 4, renorm=0, norm_type=0, **kw)
    renormed, ids1, _ = npu_moe_gating_top_k(x, 4, renorm=1, norm_type=0, **kw)
    assert torch.equal(ids0, ids1)
    torch.testing.assert_close(plain, norm.gather(1, ids0.long()) * 2.0)
    torch.testing.assert_close(renormed, plain / plain.sum(-1, keepdim=True) * 2.0)
    sig0, _, _ = npu_moe_gating_top_k(x, 4, renorm=0, norm_type=1, **kw)
    sig1, _, _ = npu_moe_gating_top_k(x, 4, renorm=1, norm_type=1, **kw)
    torch.testing.assert_close(sig0, sig1)
    torch.testing.assert_close(sig0.sum(-1), torch.full((5,), 2.0))
    with pytest.raises(ValueError, match="renorm must be 0 or 1"):
        npu_moe_gating_top_k(x, 4, renorm=2, norm_type=0, **kw)


# ---- every implementation, in a process of the job (the overlay active) ----------------------------------------
def _original(name: str):
    from verl_patches.patching.registry import get_registry

    (rec,) = [r for r in get_registry().records if r.patch.name == name]
    assert rec.status == "applied", (name, rec.status, rec.detail)
    return rec.original


def rank_every_router(rank: int, world: int) -> dict:
    from vllm_ascend.ops import fused_moe  # before MindSpeed, which swaps torch.compile for torch.jit.script

    # isort: split
    import torch_npu
    from mindspeed_llm.core.transformer.moe.moe_utils import topk_softmax_with_capacity
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    from verl_patches.weights.config import make_tiny_config

    case = router_case()
    logits, bias = case["logits"], case["bias"]
    out: dict = {"case": {k: v.tolist() for k, v in case.items()}}
    w, i = deepseek_gate(logits, bias, GROUPS, TOPK_GROUPS, TOPK, SCALE)
    out["deepseek"] = (w.tolist(), i.tolist())

    cfg = make_tiny_config(
        vocab_size=32, hidden_size=HIDDEN, n_routed_experts=EXPERTS, n_group=GROUPS, topk_group=TOPK_GROUPS,
        num_experts_per_tok=TOPK, routed_scaling_factor=SCALE,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(DeepseekV3Config(**cfg))
    with torch.no_grad():
        router.weight.copy_(case["weight"])
        router.e_score_correction_bias.copy_(bias)
    i, w = router(case["hidden"])
    out["hf"] = (w.tolist(), i.tolist())
    unpatched = _original(HF_PATCH)(router, logits.sigmoid())
    out["hf_unpatched"] = unpatched.tolist()

    # MindSpeed-LLM's TopKRouter.routing, noaux_tc branch: the call its router makes (no capacity, no padding)
    probs, top, _ = topk_softmax_with_capacity(
        logits, TOPK, capacity_factor=None, pad_to_capacity=False, drop_policy="probs", use_pre_softmax=False,
        num_groups=GROUPS, group_topk=TOPK_GROUPS, scaling_factor=SCALE, deterministic_mode=False,
        score_function="sigmoid", expert_bias=bias, norm_topk_prob=True,
    )  # fmt: skip
    out["mindspeed"] = (probs.tolist(), top.tolist())

    # vllm-ascend 0.9.1's 256-expert branch (AscendUnquantizedFusedMoEMethod.apply), its arguments as written
    y, ids, _ = torch_npu.npu_moe_gating_top_k(
        logits, k=TOPK, bias=bias, k_group=TOPK_GROUPS, group_count=GROUPS, group_select_mode=1, renorm=0,
        norm_type=1, routed_scaling_factor=1, eps=1e-20,
    )  # fmt: skip
    out["kernel"] = ((y * SCALE).tolist(), ids.tolist())  # CustomDeepseekV2MoE scales the routed output

    kw = dict(
        top_k=TOPK, use_grouped_topk=True, renormalize=True, topk_group=TOPK_GROUPS, num_expert_group=GROUPS,
        scoring_func="sigmoid", e_score_correction_bias=bias,
    )  # fmt: skip
    w, i = fused_moe.select_experts(case["hidden"], logits, **kw)
    out["vllm_ascend_native"] = ((w * SCALE).tolist(), i.tolist())
    _, i = _original(VLLM_ASCEND_PATCH)(case["hidden"], logits, **kw)
    out["vllm_ascend_native_unpatched"] = i.tolist()
    out["fused_moe_apply"] = {n: fused_moe_apply(fused_moe, case, n) for n in (EXPERTS, EXPERTS // 2)}
    return out


def fused_moe_apply(fused_moe, case: dict, experts: int) -> dict:
    """vllm-ascend's own AscendUnquantizedFusedMoEMethod.apply (the call AscendFusedMoE.forward makes) on
    `experts` routed experts (the first of the case), EP1 (AllGather): the router kernels it dispatched (the
    profiler's count) and its output against the per-token sum over DeepSeek's choice."""
    from types import SimpleNamespace

    from vllm_ascend.ascend_forward_context import FusedMoEState

    g = torch.Generator().manual_seed(7)
    inter = 4
    w13 = torch.randn(experts, 2 * inter, HIDDEN, generator=g) / 8  # gate rows, then up rows (vLLM's w13)
    w2 = torch.randn(experts, HIDDEN, inter, generator=g) / 2
    logits, bias = case["logits"][:, :experts].contiguous(), case["bias"][:experts].contiguous()
    method = object.__new__(fused_moe.AscendUnquantizedFusedMoEMethod)  # no vLLM config: apply reads only this
    method.use_aclgraph = False
    real_context = fused_moe.get_forward_context
    fused_moe.get_forward_context = lambda: SimpleNamespace(fused_moe_state=FusedMoEState.AllGather)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            y = method.apply(
                SimpleNamespace(w13_weight=w13, w2_weight=w2), case["hidden"], logits, top_k=TOPK, renormalize=True,
                use_grouped_topk=True, global_num_experts=experts, topk_group=TOPK_GROUPS, num_expert_group=GROUPS,
                scoring_func="sigmoid", e_score_correction_bias=bias,
            )  # fmt: skip
    finally:
        fused_moe.get_forward_context = real_context
    y = y[0]  # fused_experts: (hidden states, tokens per expert, their list type)
    weights, ids = deepseek_gate(logits, bias, GROUPS, TOPK_GROUPS, TOPK, 1.0)
    want = torch.zeros_like(case["hidden"], dtype=torch.float64)
    for t in range(TOKENS):
        for w, e in zip(weights[t].tolist(), ids[t].tolist()):
            h = case["hidden"][t].double()
            gate, up = (w13[e].double() @ h).split(inter)
            want[t] += w * (w2[e].double() @ (torch.nn.functional.silu(gate) * up))
    calls = {k.split("::")[-1]: v.count for k, v in ((e.key, e) for e in prof.key_averages()) if "gating_top_k" in k}
    return {"router_kernels": calls, "max_abs_diff": float((y.double() - want).abs().max())}


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.needs_components("mindspeed", "mindspeed_llm", "vllm", "vllm_ascend")
def test_training_rollout_and_reference_route_as_deepseeks_gate() -> None:
    (out,) = run_ranks(rank_every_router, 1, 600, preload=("verl_patches.prelude_patch",), backend=None)
    want_ids, want_w = by_expert(*map(torch.tensor, out["deepseek"]))
    for name in ("hf", "mindspeed", "kernel", "vllm_ascend_native"):
        ids, w = by_expert(*map(torch.tensor, out[name]))
        assert torch.equal(ids, want_ids), name
        torch.testing.assert_close(w, want_w, rtol=1e-5, atol=1e-6, msg=name)
    # vllm-ascend's MoE method: the fused kernel at 256 experts (the tiny run's count), its eager path below;
    # both route as DeepSeek
    applied = out["fused_moe_apply"]
    assert applied[str(EXPERTS)]["router_kernels"] == {"npu_moe_gating_top_k": 1}, applied
    assert applied[str(EXPERTS // 2)]["router_kernels"] == {}, applied
    assert all(a["max_abs_diff"] < 1e-5 for a in applied.values()), applied
    # without the patches, HF and vllm-ascend's native branch choose experts of groups DeepSeek did not keep
    for name in ("hf_unpatched", "vllm_ascend_native_unpatched"):
        got = torch.tensor(out[name]).long().sort(dim=-1).values
        differ = [t for t in range(TOKENS) if not torch.equal(got[t], want_ids[t])]
        assert len(differ) == TOKENS, (name, differ)


def rank_unpatched_base_pass_is_refused(rank: int, world: int) -> dict:
    from verl_patches.cpu_proof.tiny_assets import TinySpec, require_deepseek_routing
    from verl_patches.patches.catalog import all_patches
    from verl_patches.patches.transformers.deepseek_v3_router import hf_routes_as_deepseek
    from verl_patches.patching.registry import Registry

    out = {"plain_hf": hf_routes_as_deepseek()}
    require_deepseek_routing(TinySpec())  # no bias: nothing to refuse
    try:
        require_deepseek_routing(TinySpec(router_bias_mean=ROUTER_BIAS_MEAN, router_bias_std=ROUTER_BIAS_STD))
        out["refused"] = ""
    except RuntimeError as e:
        out["refused"] = str(e)
    Registry([p for p in all_patches() if p.name == HF_PATCH], "cpu").activate()
    out["patched_hf"] = hf_routes_as_deepseek()
    require_deepseek_routing(TinySpec(router_bias_mean=ROUTER_BIAS_MEAN, router_bias_std=ROUTER_BIAS_STD))
    return out


@pytest.mark.multiproc
def test_a_base_pass_with_a_bias_needs_deepseeks_mask_in_hf() -> None:
    (out,) = run_ranks(rank_unpatched_base_pass_is_refused, 1, 300, backend=None)
    assert out["plain_hf"] is False and out["patched_hf"] is True
    assert "0.0 group mask" in out["refused"] and "verl_patches.prelude_patch" in out["refused"]
