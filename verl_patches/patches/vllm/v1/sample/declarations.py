"""Patches of vllm.v1.sample.*."""

from verl_patches.patching.declaration import wrap

PATCHES = [
    wrap(
        name="vllm.v1.sample.sampler.Sampler.forward.tempered_logprobs",
        target="vllm.v1.sample.sampler:Sampler.forward",
        fingerprint="sha256:2e64a948c7d7ed85",
        by="verl_patches.rollout.tempered_logprobs:wrap_sampler_forward",
        vendor_item="local",
        reason="report the sampled tokens' log-probs at the sampling temperature (log_softmax(logits / T)), "
        "the distribution the actor scores (C3); vLLM V1 reports raw log-probs, so at T=0.9 the "
        "rollout/train log-prob mismatch metric compared two different distributions",
    ),
]
