"""The rollout's sampled-token log-probs at the sampling temperature: vLLM V1's real Sampler, patched.

vLLM 0.9.1's V1 sampler reports raw log-probs; the actor scores log_softmax(logits / T). The declared wrap
(`verl_patches.rollout.tempered_logprobs`) must report the tempered ones for every sampled request, keep
greedy rows raw, and leave the sampled tokens exactly as vLLM draws them.
"""

from __future__ import annotations

import pytest
import torch

from verl_patches.rollout.tempered_logprobs import tempered_logprobs, wrap_sampler_forward

sampler_mod = pytest.importorskip("vllm.v1.sample.sampler")
from vllm.v1.sample.metadata import SamplingMetadata  # noqa: E402


def metadata(temps: list[float], max_num_logprobs: int | None, top_k: list[int] | None = None) -> SamplingMetadata:
    n = len(temps)
    t = torch.tensor(temps, dtype=torch.float32)
    greedy = [x < 1e-5 for x in temps]
    return SamplingMetadata(
        temperature=t,
        all_greedy=all(greedy),
        all_random=not any(greedy),
        top_p=None,
        top_k=None if top_k is None else torch.tensor(top_k),
        min_p=None,
        generators={},
        max_num_logprobs=max_num_logprobs,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(n),
        presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n),
        output_token_ids=[[] for _ in range(n)],
        min_tokens={},
        logit_bias=[None] * n,
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
    )


def run(forward, logits: torch.Tensor, md: SamplingMetadata, seed: int):
    torch.manual_seed(seed)
    return forward(sampler_mod.Sampler(), logits.clone(), md)


@pytest.fixture
def logits() -> torch.Tensor:
    return torch.randn(6, 50, generator=torch.Generator().manual_seed(3)) * 3


def test_tempered_logprobs_divide_sampled_rows_and_keep_greedy_rows_raw(logits: torch.Tensor) -> None:
    t = torch.tensor([0.9, 0.0, 1.3, 0.5, 1.0, 2.0])
    got = tempered_logprobs(logits, t)
    divisor = torch.tensor([0.9, 1.0, 1.3, 0.5, 1.0, 2.0]).unsqueeze(1)
    torch.testing.assert_close(got, torch.log_softmax(logits / divisor, -1))
    torch.testing.assert_close(tempered_logprobs(logits, None), torch.log_softmax(logits, -1))


@pytest.mark.parametrize(
    "temps,top_k", [([0.9] * 6, None), ([0.9, 0.0, 1.3, 0.5, 1.0, 2.0], None), ([0.9] * 6, [5] * 6)]
)
def test_patched_vllm_sampler_reports_tempered_log_probs_and_samples_the_same_tokens(
    logits: torch.Tensor, temps: list[float], top_k: list[int] | None
) -> None:
    original = sampler_mod.Sampler.forward
    patched = wrap_sampler_forward(original)
    md = metadata(temps, 2, top_k)
    before, after = run(original, logits, md, 7), run(patched, logits, md, 7)
    torch.testing.assert_close(after.sampled_token_ids, before.sampled_token_ids, rtol=0, atol=0)
    sampled = after.sampled_token_ids.reshape(-1).long()
    want = tempered_logprobs(logits, md.temperature).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    lp = after.logprobs_tensors
    assert torch.equal(lp.logprob_token_ids[:, 0].long(), sampled)
    torch.testing.assert_close(lp.logprobs[:, 0], want)
    assert lp.logprobs.shape == before.logprobs_tensors.logprobs.shape  # the sampled token + the top 2
    raw = torch.log_softmax(logits, -1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
    for row, t in enumerate(temps):
        if t < 1e-5 or t == 1.0:
            torch.testing.assert_close(lp.logprobs[row, 0], raw[row])
        else:
            assert not torch.isclose(lp.logprobs[row, 0], raw[row])


def test_no_log_probs_requested_is_upstream_unchanged(logits: torch.Tensor) -> None:
    patched = wrap_sampler_forward(sampler_mod.Sampler.forward)
    out = run(patched, logits, metadata([0.9] * 6, None), 1)
    assert out.logprobs_tensors is None
