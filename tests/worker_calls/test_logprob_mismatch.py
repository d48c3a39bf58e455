"""The rollout/training log-prob mismatch (issue 15 item 3): mean |Δ| and mean |exp(Δ)-1| over response
tokens only, float64 math, clear errors for shapes, empty masks and non-finite values."""

from __future__ import annotations

import math

import pytest
import torch

from verl_patches.worker_calls.logprob_mismatch import (
    ABS_DIFF,
    ABS_DIFF_MAX,
    RATIO_DEV,
    TOKENS,
    batch_mismatch_metrics,
    mismatch_metrics,
)


def test_identical_log_probs_give_zero() -> None:
    lp = -torch.rand(3, 4)
    m = mismatch_metrics(lp, lp.clone(), torch.ones(3, 4))
    assert m[ABS_DIFF] == 0 and m[RATIO_DEV] == 0 and m[ABS_DIFF_MAX] == 0 and m[TOKENS] == 12


def test_known_values_and_masking() -> None:
    rollout = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, 99.0]])
    train = torch.tensor([[-1.1, -1.8, -3.0], [-0.5, -0.7, -7.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # the masked token's huge difference must not count
    m = mismatch_metrics(rollout, train, mask)
    deltas = [-0.1, 0.2, 0.0, 0.0, -0.2]
    assert m[ABS_DIFF] == pytest.approx(sum(abs(d) for d in deltas) / 5, rel=1e-6)
    assert m[RATIO_DEV] == pytest.approx(sum(abs(math.expm1(d)) for d in deltas) / 5, rel=1e-6)
    assert m[ABS_DIFF_MAX] == pytest.approx(0.2, rel=1e-6)
    assert m[TOKENS] == 5


def test_ratio_deviation_is_asymmetric_in_sign() -> None:
    up = mismatch_metrics(torch.zeros(1, 1), torch.full((1, 1), 0.5), torch.ones(1, 1))
    down = mismatch_metrics(torch.zeros(1, 1), torch.full((1, 1), -0.5), torch.ones(1, 1))
    assert up[ABS_DIFF] == down[ABS_DIFF] == 0.5
    assert up[RATIO_DEV] == pytest.approx(math.exp(0.5) - 1) and down[RATIO_DEV] == pytest.approx(1 - math.exp(-0.5))


def test_small_fp32_rounding_stays_far_below_the_threshold() -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 6, 50)
    tokens = torch.randint(0, 50, (8, 6, 1))
    a = torch.log_softmax(logits / 0.9, -1).gather(-1, tokens).squeeze(-1)
    b = (torch.log_softmax(logits.double() / 0.9, -1)).gather(-1, tokens).squeeze(-1).float()
    assert mismatch_metrics(a, b, torch.ones(8, 6))[ABS_DIFF] < 1e-5


@pytest.mark.parametrize("shapes", [((2, 3), (2, 3), (2, 4)), ((2, 3), (3, 3), (2, 3))])
def test_shape_mismatch_is_an_error(shapes: tuple) -> None:
    a, b, m = (torch.zeros(s) for s in shapes)
    with pytest.raises(ValueError, match="shapes differ"):
        mismatch_metrics(a, b, m)


def test_empty_mask_and_non_finite_are_errors() -> None:
    with pytest.raises(ValueError, match="selects no token"):
        mismatch_metrics(torch.zeros(2, 2), torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="non-finite"):
        mismatch_metrics(torch.tensor([[float("-inf")]]), torch.zeros(1, 1), torch.ones(1, 1))


def test_batch_form_needs_both_keys() -> None:
    from verl import DataProto

    lp = -torch.rand(2, 3)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, -1] = 0
    base = {"responses": torch.zeros(2, 3, dtype=torch.long), "attention_mask": mask}
    assert batch_mismatch_metrics(DataProto.from_dict({**base, "rollout_log_probs": lp})) == {}
    m = batch_mismatch_metrics(DataProto.from_dict({**base, "rollout_log_probs": lp, "old_log_probs": lp + 0.5}))
    assert m[TOKENS] == 5 and m[ABS_DIFF] == pytest.approx(0.5)
