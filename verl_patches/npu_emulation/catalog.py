"""Every emulated torch_npu / MindSpeed operation, with the formula it is tested against, and every
MindSpeed feature of the A3 profile that cannot run on a CPU host, with the reason. Pure data."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EmulatedOp:
    name: str  # as the caller spells it
    provider: str  # torch_npu (the extension) or the MindSpeed builder op it replaces
    implementation: str  # module:function of the plain-torch version
    reference: str  # the formula the tests check, forward and backward


@dataclass(frozen=True)
class CpuLimit:
    feature: str
    reason: str


OPS: tuple[EmulatedOp, ...] = (
    EmulatedOp(
        "torch_npu.npu_rms_norm",
        "torch_npu",
        "verl_patches.npu_emulation.ops.norm:npu_rms_norm",
        "y = x * rsqrt(mean(x^2) + eps) * gamma (fp32 inside), returns (y, rstd)",
    ),
    EmulatedOp(
        "torch_npu.npu_swiglu",
        "torch_npu",
        "verl_patches.npu_emulation.ops.activation:npu_swiglu",
        "silu(a) * b, (a, b) = chunk(x, 2, dim)",
    ),
    EmulatedOp(
        "torch_npu.npu_swiglu_backward",
        "torch_npu",
        "verl_patches.npu_emulation.ops.activation:npu_swiglu_backward",
        "[g*b*s*(1+a*(1-s)), g*silu(a)], s = sigmoid(a)",
    ),
    EmulatedOp(
        "torch_npu.npu_rotary_mul",
        "torch_npu",
        "verl_patches.npu_emulation.ops.rotary:npu_rotary_mul",
        "x*cos + rotate_half(x)*sin",
    ),
    EmulatedOp(
        "mindspeed npu_rotary_position_embedding",
        "MindSpeed builder RotaryPositionEmbeddingOpBuilder",
        "verl_patches.npu_emulation.ops.rotary:npu_rotary_position_embedding",
        "x*cos + rotate(x)*sin; mode 0 rotate-half, mode 1 interleaved pairs",
    ),
    EmulatedOp(
        "torch_npu.npu_fusion_attention",
        "torch_npu",
        "verl_patches.npu_emulation.ops.attention:npu_fusion_attention",
        "softmax(scale*q k^T + pse, mask True=masked) v per head, GQA, layouts BNSD/BSND/BSH/SBH/TND, "
        "sparse_mode 0-4, pre/next token band",
    ),
    EmulatedOp(
        "torch_npu.npu_fusion_attention_grad",
        "torch_npu",
        "verl_patches.npu_emulation.ops.attention:npu_fusion_attention_grad",
        "autograd of the forward formula",
    ),
    EmulatedOp(
        "mindspeed npu_fusion_attention_v2 (+grad)",
        "MindSpeed builder FusionAttentionV2OpBuilder",
        "verl_patches.npu_emulation.ops.attention:npu_fusion_attention_v2",
        "as torch_npu.npu_fusion_attention (pse_type 1)",
    ),
    EmulatedOp(
        "torch_npu.npu_scaled_masked_softmax",
        "torch_npu",
        "verl_patches.npu_emulation.ops.softmax:npu_scaled_masked_softmax",
        "softmax(x*scale, masked at -10000)",
    ),
    EmulatedOp(
        "mindspeed npu_moe_token_permute",
        "MindSpeed builder MoeTokenPermuteOpBuilder",
        "verl_patches.npu_emulation.ops.moe:npu_moe_token_permute",
        "stable argsort of expert ids; rows tokens[sorted // topk]",
    ),
    EmulatedOp(
        "mindspeed npu_moe_token_unpermute",
        "MindSpeed builder MoeTokenUnpermuteOpBuilder",
        "verl_patches.npu_emulation.ops.moe:npu_moe_token_unpermute",
        "scatter rows back, weight by probs, sum over topk",
    ),
    EmulatedOp(
        "mindspeed npu_gmm / npu_gmm_v2",
        "MindSpeed builders GMMOpBuilder, GMMV2OpBuilder",
        "verl_patches.npu_emulation.ops.gmm:npu_gmm",
        "y[group e] = x[group e] @ w[e]; group_list cumulative (v1) or counts (v2)",
    ),
    EmulatedOp(
        "mindspeed npu_gmm_backward",
        "MindSpeed builders GMMOpBuilder, GMMV2OpBuilder",
        "verl_patches.npu_emulation.ops.gmm:npu_gmm_backward",
        "dx = dy @ w[e]^T, dw[e] = x[e]^T dy[e]",
    ),
    EmulatedOp(
        "mindspeed npu_gmm_backward_fusion",
        "MindSpeed builders GMMOpBuilder, GMMV2OpBuilder",
        "verl_patches.npu_emulation.ops.gmm:npu_gmm_backward_fusion",
        "dx only (dw goes to main_grad)",
    ),
    EmulatedOp(
        "mindspeed npu_groupmatmul_add_fp32",
        "MindSpeed builder GroupMatmulAddOpBuilder (ATB)",
        "verl_patches.npu_emulation.ops.gmm:npu_groupmatmul_add_fp32",
        "main_grad[e] += x[e]^T dy[e] in fp32",
    ),
    EmulatedOp(
        "mindspeed npu_matmul_add_fp32",
        "MindSpeed builder MatmulAddOpBuilder (ATB)",
        "verl_patches.npu_emulation.ops.gmm:npu_matmul_add_fp32",
        "main_grad += dy^T x in fp32",
    ),
    EmulatedOp(
        "torch_npu.npu_apply_adam_w",
        "torch_npu",
        "verl_patches.npu_emulation.ops.optim:npu_apply_adam_w",
        "torch.optim.AdamW step t, given beta^(t-1) as MindSpeed passes it",
    ),
    EmulatedOp(
        "mindspeed npu_apply_fused_adamw_v2",
        "MindSpeed builder FusedAdamWV2OpBuilder (swap optimizer)",
        "verl_patches.npu_emulation.ops.optim:npu_apply_fused_adamw_v2",
        "torch.optim.AdamW step t (amsgrad, maximize)",
    ),
)

# MindSpeed features (A3 profile) and NPU facilities that do not run on a CPU host.
CPU_LIMITS: tuple[CpuLimit, ...] = (
    CpuLimit(
        "MindSpeed op builders (JIT C++ against CANN/ATB)",
        "need the CANN toolkit and an NPU; on CPU every builder the profile uses returns the plain-torch ops above",
    ),
    CpuLimit(
        "attention dropout in npu_fusion_attention (keep_prob < 1)",
        "the kernel's dropout mask generator is not reproduced; the A3 profile sets attention_dropout=0",
    ),
    CpuLimit(
        "torchair graph mode (GE converters, GE compile)",
        "Ascend graph engine only; converters are registered and never called on CPU. Emulated instead: "
        "torchair.get_npu_backend runs the graph dynamo captures (vllm-ascend's fullgraph=True tracing is "
        "real) and enforces frozen_parameter: a parameter whose storage moved after the graph's first run "
        "raises FrozenParameterMoved naming it, where the NPU would read the old address",
    ),
    CpuLimit(
        "swap_optimizer (optimizer state swapped host<->device)",
        "runs (MindSpeed's SwapDistributedOptimizer, emulated fused AdamW), but on a CPU host device memory is "
        "host memory and streams are one: the swap moves nothing and its memory saving cannot show",
    ),
    CpuLimit(
        "overlap_grad_reduce / overlap_param_gather / moe_alltoall_overlap_comm / moe_permutation_async_comm",
        "run with the same code, but gloo collectives and the single CPU 'stream' serialise them: "
        "no overlap happens, results are identical",
    ),
    CpuLimit(
        "use_fused_mlp",
        "MindSpeed-LLM installs it only through its own pretrain model provider (training.py), which verl does "
        "not use; it also needs sequence parallel",
    ),
    CpuLimit(
        "HCCL process groups and hcom names (npu_all_gather_base_mm, npu_mm_reduce_scatter_base, MC2)",
        "gloo has no HCCL communicator names; the A3 profile does not enable MC2 (use_ascend_mc2)",
    ),
    CpuLimit(
        "NPU memory statistics, streams, events, profiler NPU activity",
        "the host has no device allocator or streams: memory stats are 0, totals are host memory, streams are one",
    ),
)


def ops_table() -> list[dict]:
    return [asdict(op) for op in OPS]


def limits_table() -> list[dict]:
    return [asdict(lim) for lim in CPU_LIMITS]
