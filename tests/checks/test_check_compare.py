"""Comparison, verdict and the scored sequences of check_logprobs (pure functions)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from verl_patches.checks.compare import compare, verdict
from verl_patches.checks.sequences import dp_share, make_sequences, response_log_probs, sequence_shape


@pytest.mark.parametrize("b,j", list(itertools.product(range(3), range(5))))
def test_worst_token_is_located_in_sequence_coordinates(b, j):
    ids = torch.arange(3 * 8).view(3, 8)
    ref = torch.zeros(3, 5)
    got = ref.clone()
    got += 1e-6
    got[b, j] = 0.5
    d = compare("megatron", ref, got, ids)
    assert (d.worst_seq, d.worst_pos, d.worst_token) == (b, 3 + j, int(ids[b, 3 + j]))
    assert d.max_abs == pytest.approx(0.5) and d.mean_abs == pytest.approx((0.5 + 14e-6) / 15)
    assert d.got == pytest.approx(0.5) and d.reference == 0.0


def test_non_finite_log_probs_are_an_infinite_difference():
    ref = torch.zeros(1, 4)
    got = torch.tensor([[0.0, float("nan"), 0.0, 0.0]])
    d = compare("rollout", ref, got, torch.zeros(1, 6, dtype=torch.long))
    assert d.max_abs == math.inf and d.worst_pos == 3
    ok, lines = verdict([d], 1.0)
    assert not ok and "FAIL rollout" in lines[-1]


def test_verdict_names_each_failing_engine_and_its_worst_position():
    ids = torch.zeros(2, 6, dtype=torch.long)
    ref = torch.zeros(2, 4)
    good = compare("megatron", ref, ref + 1e-7, ids)
    bad_got = ref.clone()
    bad_got[1, 2] = -2.0
    bad = compare("rollout", ref, bad_got, ids)
    ok, lines = verdict([good, bad], 1e-3)
    assert not ok
    assert lines[-1] == "FAIL rollout: max |diff| 2.000e+00 > tolerance 0.001 at sequence 1, token position 4"
    assert not any(line.startswith("FAIL megatron") for line in lines)
    ok, lines = verdict([good], 1e-3)
    assert ok and lines[-1].startswith("PASS")


def test_shape_mismatch_is_an_error_naming_the_engine():
    with pytest.raises(ValueError, match="megatron"):
        compare("megatron", torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2, 6, dtype=torch.long))


@pytest.mark.parametrize("tokens,dp", list(itertools.product([2, 3, 8, 17], [1, 2, 3, 4])))
def test_sequence_shape_and_dp_shares_cover_the_batch(tokens, dp):
    s = sequence_shape(tokens, dp)
    assert s.total == tokens and s.prompt >= 1 and s.response >= 1 and s.batch % dp == 0 and s.batch >= 2
    batch = make_sequences(s, 50, seed=3)
    assert batch["input_ids"].shape == (s.batch, tokens) and int(batch["input_ids"].max()) < 50
    assert torch.equal(batch["responses"], batch["input_ids"][:, s.prompt :])
    shares = [dp_share(batch, dp, d) for d in range(dp)]
    assert torch.equal(torch.cat([x["input_ids"] for x in shares]), batch["input_ids"])
    assert torch.equal(make_sequences(s, 50, seed=3)["input_ids"], batch["input_ids"])


def test_too_few_tokens_is_an_error():
    with pytest.raises(ValueError, match="--tokens 1"):
        sequence_shape(1, 1)


def test_response_log_probs_score_each_token_from_its_prefix():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 7, 11, generator=g)
    resp = torch.randint(0, 11, (2, 4), generator=g)
    got = response_log_probs(logits, resp, temperature=0.5)
    for b in range(2):
        for j in range(4):
            want = torch.log_softmax(logits[b, 7 - 4 + j - 1] / 0.5, -1)[resp[b, j]]
            assert got[b, j] == pytest.approx(float(want), abs=1e-6)
