"""Patches of vllm_ascend.* (v0.9.1)."""

from verl_patches.patching.declaration import Kind, Patch, lazy_call

_KV_NZ_REASON = ("F4 (KV-NZ fix) as a runtime patch, never git apply: {what}. NPU kernels only: checked on CPU "
                 "structurally (calls and cache modes reaching torch_npu), NOT numerically")

PATCHES = [
    Patch(
        name="vllm_ascend.mla_v1.kv_nz.torch_npu",
        target="vllm_ascend.attention.mla_v1:torch_npu",
        kind=Kind.WRAP,
        fingerprint="sha256:8adec96dbd32c448",
        fingerprint_of=("vllm_ascend.attention.mla_v1:AscendMLAImpl.forward",
                        "vllm_ascend.attention.mla_v1:AscendMLAImpl.exec_kv_prefill"),
        replacement=lazy_call("verl_patches.patches.vllm_ascend.attention.kv_nz:proxied_torch_npu"),
        vendor_item="F4",
        reason=_KV_NZ_REASON.format(what="mla_v1's torch_npu maps PA_BLK_NZ to PA_NZ in exec_kv_prefill and skips "
                                         "the ND re-write (_npu_reshape_and_cache) in graph-mode forward"),
        devices=("npu",),
        rebind=False,  # only mla_v1's own name `torch_npu`
    ),
    Patch(
        name="vllm_ascend.mla_v1.kv_nz.exec_kv_prefill",
        target="vllm_ascend.attention.mla_v1:AscendMLAImpl.exec_kv_prefill",
        kind=Kind.WRAP,
        fingerprint="sha256:9e5bb9ac7e2fc0bc",
        replacement=lazy_call("verl_patches.patches.vllm_ascend.attention.kv_nz:wrap_exec_kv_prefill"),
        vendor_item="F4",
        reason=_KV_NZ_REASON.format(what="marks the prefill cache write so enable_kv_nz uses cache_mode PA_NZ"),
        devices=("npu",),
    ),
    Patch(
        name="vllm_ascend.mla_v1.kv_nz.forward",
        target="vllm_ascend.attention.mla_v1:AscendMLAImpl.forward",
        kind=Kind.WRAP,
        fingerprint="sha256:267f96407305f00a",
        replacement=lazy_call("verl_patches.patches.vllm_ascend.attention.kv_nz:wrap_forward"),
        vendor_item="F4",
        reason=_KV_NZ_REASON.format(what="marks TorchAir graph-mode forward so the extra ND cache writes are skipped"),
        devices=("npu",),
    ),
    Patch(
        name="vllm_ascend.model_runner_v1.dp_sync_over_hccl.dist",
        target="vllm_ascend.worker.model_runner_v1:dist",
        kind=Kind.WRAP,
        fingerprint="sha256:0a368e62fb52f5f9",
        fingerprint_of=("vllm_ascend.worker.model_runner_v1:NPUModelRunner._get_forward_metadata_across_dp",),
        replacement=lazy_call("verl_patches.patches.vllm_ascend.worker.dp_sync:proxied_dist"),
        vendor_item="local",
        reason="per-step DP forward-metadata all-reduce over HCCL instead of Gloo (vendor measured rollout "
               "385 s -> 322 s, never shipped); model_runner_v1's `dist` routes only that call to the device group",
        devices=("npu",),
        rebind=False,
    ),
    Patch(
        name="vllm_ascend.model_runner_v1.dp_sync_over_hccl.method",
        target="vllm_ascend.worker.model_runner_v1:NPUModelRunner._get_forward_metadata_across_dp",
        kind=Kind.WRAP,
        fingerprint="sha256:0a368e62fb52f5f9",
        replacement=lazy_call("verl_patches.patches.vllm_ascend.worker.dp_sync:wrap_forward_metadata"),
        vendor_item="local",
        reason="marks the DP metadata all-reduce so it runs on the DP group's device group (HCCL on A3; gloo "
               "stays on CPU, where this patch does not apply)",
        devices=("npu",),
    ),
]

PATCHES.append(
    Patch(
        name="npu.vllm_ascend.kernels_path",
        target="vllm_ascend:__path__",
        kind=Kind.WRAP,
        fingerprint="sha256:4ddbef16d8c2f364",
        fingerprint_of=("vllm_ascend.utils:enable_custom_op",),
        replacement=lazy_call("verl_patches.rollout.kernels_path:with_kernel_dir"),
        vendor_item="K3",
        reason="vllm_ascend_C built once from the pinned sdist into a folder outside the vendored tree "
               "(python -m verl_patches.rollout.kernels build); the package's search path includes it",
        devices=("npu",),
        rebind=False,
    )
)
