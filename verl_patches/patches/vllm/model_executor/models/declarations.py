"""Patches of vLLM's model registry."""

from verl_patches.patching.declaration import CPU_ONLY, wrap

PATCHES = [
    wrap(
        name="cpu.vllm.model_registry.inspect_in_process",
        target="vllm.model_executor.models.registry:_LazyRegisteredModel.inspect_model_cls",
        fingerprint="sha256:9bba2b6b7f17f76f",
        by="verl_patches.patches.vllm.model_executor.models.registry:inspect_in_process",
        calls_original=False,
        relies_on=(
            ("vllm.model_executor.models.registry:_ModelInfo.from_model_cls", "sha256:ddf6810962f22eaa"),
            ("vllm.model_executor.models.registry:_LazyRegisteredModel.load_model_cls", "sha256:d4146197ad765eab"),
        ),
        vendor_item="local",
        reason="vLLM inspects a model class registered by name (vllm-ascend's) in a new interpreter, to keep "
        "CUDA out of the caller; on a CPU host that only re-imports vLLM and vllm-ascend (about 10 s of CPU per "
        "rollout process), so the same inspection runs in the process that asks",
        devices=CPU_ONLY,
    ),
]
