"""Truncated importance sampling (issue 40, must-have 6) through the loss function the Megatron actor calls
(`rollout_correction.policy_loss`, verl's compute_policy_loss underneath): an identity when the rollout's and
the training engine's log-probs agree (loss, clip fractions, KL and gradients bit for bit), and the
formula's weights, w = min(exp(logp_train - logp_rollout), C), when a rollout is deliberately perturbed by a
known Δ (capped above C); the config keys refused by key. The actor end to end: test_actor_loss.py."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from verl_patches.driver.config_checks import check_config, rollout_correction_problems
from verl_patches.patches.verl.workers.actor.rollout_correction import (
    CAP_KEY,
    CAPPED_SHARE,
    WEIGHT_MEAN,
    RolloutLogProbsMissing,
    policy_loss,
    require_rollout_log_probs,
    tis_cap,
    tis_weights,
)
from verl_patches.trainer.config_compose import compose_config, resolved

MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
CLIP = dict(cliprange=0.2, cliprange_low=0.2, cliprange_high=0.28, clip_ratio_c=3.0)


def batch(seed: int, b: int = 4, r: int = 6, dtype: torch.dtype = torch.float64, skipped: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    log_prob = (-3 * torch.rand(b, r, generator=g, dtype=dtype)).requires_grad_()
    # skipped pass: old = current detached (ratio 1); recomputed: an old policy that differs, so clipping acts
    old = log_prob.detach() if skipped else log_prob.detach() + 0.4 * torch.randn(b, r, generator=g, dtype=dtype)
    mask = torch.ones(b, r, dtype=torch.long)
    mask[0, -2:] = 0
    mask[-1, -1:] = 0
    adv = torch.randn(b, generator=g, dtype=dtype)[:, None].expand(b, r).contiguous()
    return {"log_prob": log_prob, "old_log_prob": old, "advantages": adv, "response_mask": mask}


def run(b: dict, mode: str, rollout: torch.Tensor | None, cap: float | None) -> tuple[tuple, dict, torch.Tensor]:
    lp = b["log_prob"].detach().clone().requires_grad_()
    out, metrics = policy_loss(
        old_log_prob=b["old_log_prob"],
        log_prob=lp,
        advantages=b["advantages"],
        response_mask=b["response_mask"],
        loss_agg_mode=mode,
        rollout_log_prob=rollout,
        cap=cap,
        **CLIP,
    )
    out[0].backward()
    return out, metrics, lp.grad


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    mode=st.sampled_from(MODES),
    skipped=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    cap=st.floats(1.0, 10.0),
)
def test_agreeing_log_probs_leave_every_number_unchanged_bit_for_bit(
    seed: int, mode: str, skipped: bool, dtype: torch.dtype, cap: float
) -> None:
    b = batch(seed, dtype=dtype, skipped=skipped)
    # the rollout's log-probs equal the training engine's; outside the response the rollout pads with -1
    rollout = torch.where(b["response_mask"].bool(), b["old_log_prob"], torch.full_like(b["old_log_prob"], -1.0))
    plain, none, grad = run(b, mode, None, None)
    tis, metrics, grad_tis = run(b, mode, rollout, cap)
    assert none == {} and metrics == {WEIGHT_MEAN: 1.0, CAPPED_SHARE: 0.0}
    for a, c in zip(plain, tis):
        assert torch.equal(a, c)
    assert torch.equal(grad, grad_tis)


DELTAS = [[0.5, -0.3, 1.2, 0.0, 2.0, -5.0], [0.1, 0.69, 0.7, -0.1, 0.0, 0.0]]  # train - rollout, per token


@pytest.mark.parametrize("cap", [2.0, 1.5])
def test_a_perturbed_rollout_gets_the_formulas_weights(cap: float) -> None:
    """Skipped pass (ratio 1): each token's term is -A x w, w = min(exp(Δ), C), averaged over the tokens."""
    b = batch(3, b=2, r=6)
    b["response_mask"] = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    delta = torch.tensor(DELTAS, dtype=torch.float64)
    rollout = b["old_log_prob"] - delta
    (loss, clipfrac, kl, _), metrics, grad = run(b, "token-mean", rollout, cap)
    mask = b["response_mask"].bool()
    w = torch.tensor([[min(math.exp(d), cap) for d in row] for row in DELTAS], dtype=torch.float64)
    n = int(mask.sum())
    assert loss.item() == pytest.approx(float((-b["advantages"] * w)[mask].sum()) / n, rel=1e-12)
    # d loss / d logp = -A w / n on the response, 0 elsewhere: the weight carries no gradient of its own
    want = torch.where(mask, -b["advantages"] * w / n, torch.zeros_like(w))
    assert torch.allclose(grad, want, rtol=1e-12, atol=0)
    assert clipfrac.item() == 0 and kl.item() == 0
    assert metrics[WEIGHT_MEAN] == pytest.approx(float(w[mask].mean()), rel=1e-12)
    capped = [d for row, m in zip(DELTAS, mask.tolist()) for d, k in zip(row, m) if k and math.exp(d) > cap]
    assert metrics[CAPPED_SHARE] == pytest.approx(len(capped) / n)
    assert len(capped) >= 2  # the case exercises the cap


def test_with_clipping_each_token_term_is_scaled_by_its_weight() -> None:
    """Recomputed old log-probs (ratios away from 1, clipping and dual clipping active): the TIS loss is the
    untruncated per-token loss of the same function, token by token, times w."""
    b = batch(7, skipped=False)
    delta = 0.6 * torch.randn(b["log_prob"].shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    rollout = b["old_log_prob"] - delta
    (loss, clipfrac, _, lower), _, _ = run(b, "token-mean", rollout, 2.0)
    (_, clipfrac0, _, lower0), _, _ = run(b, "token-mean", None, None)
    assert clipfrac0.item() > 0 and clipfrac.item() == clipfrac0.item() and lower.item() == lower0.item()
    mask = b["response_mask"].bool()
    terms = []
    for i, j in mask.nonzero().tolist():  # one token's own loss: the same function over a one-token mask
        one = torch.zeros_like(b["response_mask"])
        one[i, j] = 1
        (term, *_), _, _ = run(dict(b, response_mask=one), "token-mean", None, None)
        terms.append(term.item() * min(math.exp(delta[i, j].item()), 2.0))
    assert loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)


def test_weights_mask_padding_cap_infinity_and_refuse_nan() -> None:
    train = torch.tensor([[-1.0, -2.0, -0.5]])
    rollout = torch.tensor([[-1.0, -200.0, -1.0]])  # exp(198) overflows float32: capped, not an error
    w, m = tis_weights(train, rollout, torch.tensor([[1, 1, 0]]), 2.0)
    assert w.tolist() == [[1.0, 2.0, 1.0]] and m == {WEIGHT_MEAN: 1.5, CAPPED_SHARE: 0.5}
    nan = torch.tensor([[-math.inf, -1.0]])
    with pytest.raises(ValueError, match="1 response token"):
        tis_weights(nan, nan, torch.ones(1, 2), 2.0)
    with pytest.raises(ValueError, match="shapes differ"):
        tis_weights(train, rollout, torch.ones(1, 2), 2.0)


def test_the_actor_reads_the_cap_and_requires_the_rollouts_log_probs() -> None:
    assert tis_cap(OmegaConf.create({})) is None
    assert tis_cap(OmegaConf.create({"rollout_correction": {"tis_cap": None}})) is None
    assert tis_cap(OmegaConf.create({"rollout_correction": {"tis_cap": 2}})) == 2.0
    with pytest.raises(ValueError, match=f"^{CAP_KEY}=0.5 must be a finite number >= 1"):
        tis_cap(OmegaConf.create({"rollout_correction": {"tis_cap": 0.5}}))
    require_rollout_log_probs(["advantages"], None)
    with pytest.raises(RolloutLogProbsMissing, match=f"{CAP_KEY}=2 needs the rollout's log-probs"):
        require_rollout_log_probs(["advantages", "responses"], 2.0)


A3_PROFILES = ("a3_256die_true_weight", "a3_256die_random_init", "a3_16die_smoke")


def test_tis_is_on_in_the_a3_profiles_and_the_tiny_run_at_cap_2() -> None:
    for cfg in [resolved(compose_config("ppo_mindspeed_trainer", [f"profile={p}"])) for p in A3_PROFILES] + [
        resolved(compose_config("ppo_tiny_local", []))
    ]:
        assert OmegaConf.select(cfg, CAP_KEY) == 2.0
        assert rollout_correction_problems(cfg) == []


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({CAP_KEY: "2"}, f"{CAP_KEY}='2' must be a number >= 1"),
        ({CAP_KEY: 0.9}, f"{CAP_KEY}=0.9 must be a finite number >= 1"),
        ({CAP_KEY: math.inf}, f"{CAP_KEY}=inf must be a finite number >= 1"),
        ({"actor_rollout_ref.rollout.name": "hf"}, f"{CAP_KEY}=2.0 needs the rollout's log-probs in the batch"),
        ({"actor_rollout_ref.rollout.mode": "async"}, f"{CAP_KEY}=2.0 needs the rollout's log-probs in the batch"),
        (
            {"actor_rollout_ref.actor.strategy": "fsdp"},
            f"{CAP_KEY}=2.0 needs actor_rollout_ref.actor.strategy=megatron",
        ),
    ],
)
def test_a_config_tis_cannot_run_with_is_refused_by_key(overrides: dict, message: str) -> None:
    cfg = resolved(compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"]))
    for k, v in overrides.items():
        OmegaConf.update(cfg, k, v)
    found = [p for p in check_config(cfg) if p.startswith(CAP_KEY)]
    assert len(found) == 1 and found[0].startswith(message) and "\n" not in found[0], found
    OmegaConf.update(cfg, CAP_KEY, None)  # off: nothing to refuse
    assert rollout_correction_problems(cfg) == []
