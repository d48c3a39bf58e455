"""Patches of vLLM's top-level package."""

from verl_patches.patching.declaration import wrap

PATCHES = [
    wrap(
        name="vllm.general_plugins_at_import",
        target="vllm:ModelRegistry",
        # the code relied on: vLLM's plugin loader and vllm-ascend's general plugin (its custom-op fix)
        fingerprint="sha256:6186cca18e0ee1ad",
        fingerprint_of=("vllm.plugins:load_general_plugins", "vllm_ascend:register_model"),
        by="verl_patches.patches.vllm.general_plugins:registry_after_general_plugins",
        vendor_item="local",
        reason="load vLLM's general plugins as soon as `import vllm` completes: verl's driver imports vLLM's "
        "DeepSeek model (verl.utils.vllm_utils) before any engine loads them, and on torch 2.5.1 "
        "vLLM's fp8 utilities then fail in torch.library.infer_schema (list[int]) unless "
        "vllm-ascend's general plugin has replaced direct_register_custom_op first",
        devices=("npu", "cpu"),
        rebind=False,
    ),
]
