"""Patches of vllm_ascend.* (v0.9.1)."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import CPU_ONLY, Kind, Patch, lazy_call, wrap
from verl_patches.worker_calls.env_names import KV_NZ_FLAG

_KV_NZ_REASON = (
    "F4 (KV-NZ fix) as a runtime patch, never git apply: mla_v1's torch_npu passes cache_mode "
    "PA_NZ where exec_kv_prefill asks for PA_BLK_NZ and drops the graph-mode ND re-writes "
    "(_npu_reshape_and_cache) of an NZ cache. Installed only where the profile turns on TorchAir "
    "graph mode and enable_kv_nz (the launcher sets VERL_PATCHES_KV_NZ from the config; the engine "
    "build refuses a disagreement); static, so dynamo traces it with fullgraph=True. NPU kernels "
    "only: checked on CPU structurally (calls and cache modes reaching torch_npu), NOT numerically. "
    "Never with chunked prefill (refused by config_checks.kv_nz_problems): a step that mixes prefill "
    "chunks with decodes writes its decode tokens' KV only through the re-write this drops"
)

_DP_METADATA = "vllm_ascend.worker.model_runner_v1:NPUModelRunner._get_forward_metadata_across_dp"

PATCHES = [
    Patch(
        name="vllm_ascend.mla_v1.kv_nz.torch_npu",
        target="vllm_ascend.attention.mla_v1:torch_npu",
        kind=Kind.WRAP,
        fingerprint="sha256:36b141244838467c",
        fingerprint_of=(
            "vllm_ascend.attention.mla_v1:AscendMLAImpl.forward",
            "vllm_ascend.attention.mla_v1:AscendMLAImpl.exec_kv_prefill",
            "vllm_ascend.attention.mla_v1:AscendMLAImpl.exec_kv",
        ),
        replacement=lazy_call("verl_patches.patches.vllm_ascend.attention.kv_nz:proxied_torch_npu"),
        vendor_item="F4",
        reason=_KV_NZ_REASON,
        devices=("npu",),
        env_flag=KV_NZ_FLAG,
        rebind=False,  # only mla_v1's own name `torch_npu`
    ),
    wrap(
        name="vllm_ascend.model_runner_v1.dp_sync_over_hccl.dist",
        target="vllm_ascend.worker.model_runner_v1:dist",
        fingerprint=pinned(_DP_METADATA),
        fingerprint_of=(_DP_METADATA,),
        by="verl_patches.patches.vllm_ascend.worker.dp_sync:proxied_dist",
        vendor_item="local",
        reason="per-step DP forward-metadata all-reduce over HCCL instead of Gloo (vendor measured rollout "
        "385 s -> 322 s, never shipped); model_runner_v1's `dist` routes only that call to the device group",
        devices=("npu",),
        rebind=False,
    ),
    wrap(
        name="vllm_ascend.model_runner_v1.dp_sync_over_hccl.method",
        target=_DP_METADATA,
        fingerprint=pinned(_DP_METADATA),
        by="verl_patches.patches.vllm_ascend.worker.dp_sync:wrap_forward_metadata",
        vendor_item="local",
        reason="marks the DP metadata all-reduce so it runs on the DP group's device group (HCCL on A3; gloo "
        "stays on CPU, where this patch does not apply)",
        devices=("npu",),
    ),
]

PATCHES.append(
    wrap(
        name="npu.vllm_ascend.kernels_path",
        target="vllm_ascend:__path__",
        fingerprint="sha256:4ddbef16d8c2f364",
        fingerprint_of=("vllm_ascend.utils:enable_custom_op",),
        by="verl_patches.rollout.kernels_path:with_kernel_dir",
        vendor_item="K3",
        reason="vllm_ascend_C built once from the pinned sdist into a folder outside the vendored tree "
        "(python -m verl_patches.rollout.kernels build); the package's search path includes it",
        devices=("npu",),
        rebind=False,
    )
)

PATCHES.append(
    wrap(
        name="vllm_ascend.forward_context.mc2_decode_at_small_ep",
        target="vllm_ascend.ascend_forward_context:get_fused_moe_state",
        fingerprint="sha256:be847a37e9110ee6",
        by="verl_patches.patches.vllm_ascend.forward_context.mc2_at_small_ep:wrap_fused_moe_state",
        vendor_item="local",
        reason="CPU proof at rollout EP 2: decode through MC2 dispatch/combine as A3 does at EP 256 (upstream "
        "picks All2All below EP 16, a path A3 never decodes through and one TorchAir cannot trace); prefill and "
        "EP 1 as upstream",
        devices=CPU_ONLY,
        rebind=False,  # called only inside its own module
    )
)

PATCHES.append(
    wrap(
        name="vllm_ascend.model_runner_v1.torchair_unfrozen_parameters",
        target="vllm_ascend.worker.model_runner_v1:NPUModelRunner._get_torchair_lazy_compiled_model",
        fingerprint="sha256:d6421b5fcf846eba",
        by="verl_patches.patches.vllm_ascend.worker.unfrozen_parameters:without_frozen_parameters",
        calls_original=False,  # upstream's method recompiled from its source with one assignment changed
        vendor_item="local",
        reason="TorchAir graphs take the weights as inputs at every run (frozen_parameter False, TorchAir's "
        "default) instead of binding their addresses at the first run: the rollout's weights get new device "
        "memory every step (offload for training, onload before the sync), which a frozen graph would keep "
        "reading silently; no per-step graph rebuild, no resident copy. Upstream's method otherwise unchanged",
        devices=("npu", "cpu"),
    )
)

PATCHES.append(
    wrap(
        name="vllm_ascend.fused_moe.grouped_topk_as_deepseek",
        target="vllm_ascend.ops.fused_moe:select_experts",
        fingerprint="sha256:259f46370d1ff9bd",
        # the rule it replaces is native_grouped_topk's, called from select_experts: both as written at the pin
        fingerprint_of=("vllm_ascend.ops.fused_moe:select_experts", "vllm_ascend.ops.fused_moe:native_grouped_topk"),
        by="verl_patches.patches.vllm_ascend.ops.grouped_topk:grouped_as_deepseek",
        vendor_item="local",
        reason="below 256 routed experts vllm-ascend routes by native_grouped_topk: groups scored by their max "
        "and unselected groups filled with 0.0, where DeepSeek-V3's Gate, npu_moe_gating_top_k (the 256-expert "
        "branch) and MindSpeed-LLM's training router sum each group's top 2 (with a bias) and mask with -inf; "
        "the grouped branch routes as they do, every other branch is upstream's",
        devices=("npu", "cpu"),
    )
)

PATCHES.append(
    wrap(
        name="vllm_ascend.model_runner_v1.graph_decode_counts",
        target="vllm_ascend.worker.model_runner_v1:NPUModelRunner.execute_model",
        fingerprint="sha256:8450a9b7a30d3922",
        by="verl_patches.rollout.decode_share:wrap_execute_model",
        vendor_item="local",
        reason="counts, per request, the tokens sampled in TorchAir graph decode steps and in eager steps (the "
        "runner's DP-reduced with_prefill of the step), so every step logs rollout/graph_decode_token_share: on "
        "A3 ~99 % of tokens are graph decodes, and a run whose tokens are mostly eager proves another path. "
        "Reads the step's output only; the step itself is upstream's",
        devices=("npu", "cpu"),
    )
)
