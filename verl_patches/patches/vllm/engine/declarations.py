"""Patches of vllm.engine.* (v0.9.1)."""

from verl_patches.patching.declaration import CPU_ONLY, wrap

PATCHES = [
    wrap(
        name="vllm.engine.arg_utils.v1_oracle.fp32_on_cpu",
        target="vllm.engine.arg_utils:EngineArgs._is_v1_supported_oracle",
        fingerprint="sha256:7fb72e77fbe603d7",
        by="verl_patches.patches.vllm.engine.fp32_on_cpu:wrap_v1_oracle",
        vendor_item="local",
        reason="the CPU proof's rollout runs vLLM's V1 engine in float32 (rollout/train log-probs agree to "
        "< 1e-3); V1 refuses float32 only because GPU flash attention lacks it, which the CPU emulation's "
        "kernels do not: float32 is decided as bf16, every other V1 rule by the original",
        devices=CPU_ONLY,
    ),
]
