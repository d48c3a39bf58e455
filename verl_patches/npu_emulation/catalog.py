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
    # the ops of the pinned torch_npu wheel it stands in for, "ns::name[.overload]": their schemas, Meta functions
    # and documented limits are the wheel's (wheel_contract); none for a MindSpeed builder op
    wheel_ops: tuple[str, ...] = ()


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
        wheel_ops=("npu::npu_rms_norm",),
    ),
    EmulatedOp(
        "torch_npu.npu_swiglu",
        "torch_npu",
        "verl_patches.npu_emulation.ops.activation:npu_swiglu",
        "silu(a) * b, (a, b) = chunk(x, 2, dim)",
        wheel_ops=("npu::npu_swiglu",),
    ),
    EmulatedOp(
        "torch_npu.npu_swiglu_backward",
        "torch_npu",
        "verl_patches.npu_emulation.ops.activation:npu_swiglu_backward",
        "[g*b*s*(1+a*(1-s)), g*silu(a)], s = sigmoid(a)",
        wheel_ops=("npu::npu_swiglu_backward",),
    ),
    EmulatedOp(
        "torch_npu.npu_rotary_mul",
        "torch_npu",
        "verl_patches.npu_emulation.ops.rotary:npu_rotary_mul",
        "x*cos + rotate_half(x)*sin",
        wheel_ops=("npu::npu_rotary_mul",),
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
        wheel_ops=("npu::npu_fusion_attention",),
    ),
    EmulatedOp(
        "torch_npu.npu_fusion_attention_grad",
        "torch_npu",
        "verl_patches.npu_emulation.ops.attention:npu_fusion_attention_grad",
        "autograd of the forward formula",
        wheel_ops=("npu::npu_fusion_attention_grad",),
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
        wheel_ops=("npu::npu_scaled_masked_softmax",),
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
        wheel_ops=("npu::npu_apply_adam_w.out",),
    ),
    EmulatedOp(
        "mindspeed npu_apply_fused_adamw_v2",
        "MindSpeed builder FusedAdamWV2OpBuilder (swap optimizer)",
        "verl_patches.npu_emulation.ops.optim:npu_apply_fused_adamw_v2",
        "torch.optim.AdamW step t (amsgrad, maximize)",
    ),
    EmulatedOp(
        "torch_npu.npu_moe_gating_top_k",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_gating_top_k",
        "s = sigmoid|softmax(x); choose on s + bias: k_group best groups (max or top-2 sum), then top k; "
        "y = s[chosen] / (sum + eps) (sigmoid) * routed_scaling_factor",
        wheel_ops=("npu::npu_moe_gating_top_k",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_gating_top_k_softmax",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_gating_top_k_softmax",
        "top-k of softmax(x); row_idx[t, j] = j*T + t",
        wheel_ops=("npu::npu_moe_gating_top_k_softmax",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_init_routing",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_init_routing",
        "stable sort of the (t, k) slots by expert; expanded_row_idx[k*T + t] = its sorted row; rows x[t]",
        wheel_ops=("npu::npu_moe_init_routing",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_compute_expert_tokens",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_compute_expert_tokens",
        "out[e] = #(sorted expert ids <= e)",
        wheel_ops=("npu::npu_moe_compute_expert_tokens",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_finalize_routing",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_finalize_routing",
        "out[t] = skip1 + skip2 + sum_k scales[t,k] * (rows[idx[k*T + t]] + bias[expert[t,k]]), fp32 inside",
        wheel_ops=("npu::npu_moe_finalize_routing",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_re_routing",
        "torch_npu",
        "verl_patches.npu_emulation.ops.moe_routing:npu_moe_re_routing",
        "rank-major (rank, expert) row blocks regrouped expert-major; rows per expert",
        wheel_ops=("npu::npu_moe_re_routing",),
    ),
    EmulatedOp(
        "torch_npu.npu_grouped_matmul",
        "torch_npu",
        "verl_patches.npu_emulation.ops.grouped_matmul:npu_grouped_matmul",
        "list form: y[group e rows] = x[group e rows] @ w[e] (group_type 0, cumsum or counts), or x_i @ w_i",
        wheel_ops=("npu::npu_grouped_matmul",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_distribute_dispatch_v2",
        "torch_npu 2.5.1.post1 wheel (schema and Meta function in the wheel; MC2 collective, over gloo): "
        "what vllm-ascend calls on A3, since the wheel has it",
        "verl_patches.npu_emulation.ops.moe_distribute:npu_moe_distribute_dispatch_v2",
        "each active (t, k) row (x_active_mask: masked rows are not sent) to the rank of its expert "
        "(all_to_all_single), grouped by local expert then source rank; fixed A rows; assist_info_for_combine "
        "(max(BS*K, A*128) words) holds (source rank, token, slot) per received row",
        wheel_ops=("npu::npu_moe_distribute_dispatch_v2",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_distribute_combine_v2",
        "torch_npu 2.5.1.post1 wheel (schema and Meta function in the wheel; MC2 collective, over gloo)",
        "verl_patches.npu_emulation.ops.moe_distribute:npu_moe_distribute_combine_v2",
        "each row back to the rank and slot its assist_info_for_combine triple names; "
        "out[t] = sum over active k of expert_scales[t,k] * expert_{e[t,k]}(x[t]); a fully masked token gives 0",
        wheel_ops=("npu::npu_moe_distribute_combine_v2",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_distribute_dispatch",
        "torch_npu 2.5.1.post1 wheel (schema and Meta function in the wheel; MC2 collective, over gloo): "
        "vllm-ascend's branch for a torch_npu without the v2 pair",
        "verl_patches.npu_emulation.ops.moe_distribute:npu_moe_distribute_dispatch",
        "each (t, k) row to the rank of its expert (all_to_all_single), grouped by local expert; fixed A rows; "
        "x_active_mask (reserved in v1) refused",
        wheel_ops=("npu::npu_moe_distribute_dispatch",),
    ),
    EmulatedOp(
        "torch_npu.npu_moe_distribute_combine",
        "torch_npu 2.5.1.post1 wheel (schema and Meta function in the wheel; MC2 collective, over gloo)",
        "verl_patches.npu_emulation.ops.moe_distribute:npu_moe_distribute_combine",
        "rows back to their tokens (from expert_ids and expand_idx); out[t] = sum_k expert_scales[t,k] * "
        "expert_{e[t,k]}(x[t])",
        wheel_ops=("npu::npu_moe_distribute_combine",),
    ),
    EmulatedOp(
        "torch_npu.npu_fused_infer_attention_score",
        "torch_npu (torch.ops.npu custom op; vllm-ascend MLA graph-mode decode)",
        "verl_patches.npu_emulation.ops.mla:npu_fused_infer_attention_score",
        "softmax(scale*(q k^T + q_rope k_rope^T), blocked) v per head (kv head n // (N/Nkv)) over each sequence's "
        "tokens gathered through block_table (or contiguous), layouts BNSD/BSND/BSH/TND, sparse_mode 0-3, lse flag",
        wheel_ops=("npu::npu_fused_infer_attention_score",),
    ),
    EmulatedOp(
        "torch_npu.npu_kv_rmsnorm_rope_cache",
        "torch_npu (torch.ops.npu / torch.ops.npu_inference custom op)",
        "verl_patches.npu_emulation.ops.infer_norm_rope:npu_kv_rmsnorm_rope_cache",
        "y = RMSNorm(kv[..., :Dv]) * gamma, k = interleave_rope(kv[..., Dv:]); scattered into the paged caches at "
        "slot index[t] >= 0 (PA) or per-sequence offsets (Norm), in place; returns (k_cache, ckv_cache, k, y)",
        wheel_ops=("npu::npu_kv_rmsnorm_rope_cache", "npu_inference::npu_kv_rmsnorm_rope_cache"),
    ),
    EmulatedOp(
        "torch_npu.npu_interleave_rope",
        "torch_npu (torch.ops.npu / torch.ops.npu_inference custom op)",
        "verl_patches.npu_emulation.ops.infer_norm_rope:npu_interleave_rope",
        "pair (x[2i], x[2i+1]) rotated by theta_i as (a + ib) e^(i theta_i), out = [reals, imags]; "
        "generally cat(x1, x2)*cos + cat(-x2, x1)*sin with x1, x2 = x[..., 0::2], x[..., 1::2]",
        wheel_ops=("npu::npu_interleave_rope", "npu_inference::npu_interleave_rope"),
    ),
    EmulatedOp(
        "torch_npu.npu_add_rms_norm",
        "torch_npu (torch.ops.npu custom op)",
        "verl_patches.npu_emulation.ops.infer_norm_rope:npu_add_rms_norm",
        "x = x1 + x2, y = x * rsqrt(mean(x^2) + eps) * gamma (fp32 inside), returns (y, rstd, x)",
        wheel_ops=("npu::npu_add_rms_norm",),
    ),
    EmulatedOp(
        "torch_npu.npu_prefetch",
        "torch_npu (torch.ops.npu custom op)",
        "verl_patches.npu_emulation.ops.prefetch:npu_prefetch",
        "no effect on any value (an L2 prefetch hint); max_size > 0, offset >= 0 checked",
        wheel_ops=("npu::npu_prefetch",),
    ),
    EmulatedOp(
        "torch_npu.npu_top_k_top_p",
        "torch_npu (torch.ops.npu custom op; vllm-ascend sampler with VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE=1)",
        "verl_patches.npu_emulation.ops.top_k_top_p:npu_top_k_top_p",
        "per row: -inf below the k-th largest logit, then -inf for the least likely survivors while their "
        "cumulative probability <= 1 - p (the most likely always kept)",
        wheel_ops=("npu::npu_top_k_top_p",),
    ),
    EmulatedOp(
        "torch_npu.atb.npu_ring_mla (+ .out)",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend MLA prefill)",
        "verl_patches.npu_emulation.ops.mla:npu_ring_mla",
        "per sequence softmax(scale*(q_nope k_nope^T + q_rope k_rope^T)) v, causal for mask_type_triu, lse [N, T]; "
        "calc_type_default merges with (pre_out, prev_lse): equals attention over the concatenated keys",
        wheel_ops=("atb::npu_ring_mla", "atb::npu_ring_mla.out"),
    ),
    EmulatedOp(
        "torch_npu.atb.npu_paged_cache_load (+ .out)",
        "torch_npu ATB (torch.ops.atb custom op)",
        "verl_patches.npu_emulation.ops.paged_cache:npu_paged_cache_load",
        "sequence b's tokens seq_starts[b] .. + context_lens[b], token p at block_table[b][p // bs], row p % bs, "
        "concatenated over b (lengths or cumulative ends)",
        wheel_ops=("atb::npu_paged_cache_load", "atb::npu_paged_cache_load.out"),
    ),
    EmulatedOp(
        "torch_npu._npu_reshape_and_cache",
        "torch_npu ATB (torch.ops.atb custom op)",
        "verl_patches.npu_emulation.ops.paged_cache:npu_reshape_and_cache",
        "key_cache[s // bs, s % bs] = key[t], value_cache likewise, for s = slot_indices[t] >= 0, in place",
        wheel_ops=("atb::_npu_reshape_and_cache",),
    ),
    EmulatedOp(
        "torch_npu._npu_paged_attention_mla",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend MLA eager decode)",
        "verl_patches.npu_emulation.ops.mla:npu_paged_attention_mla",
        "softmax(scale * q k^T) v over sequence b's context_lens[b] paged tokens, v = k[..., :mla_vheadsize]",
        wheel_ops=("atb::_npu_paged_attention_mla",),
    ),
    EmulatedOp(
        "torch_npu._npu_rotary_embedding",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend RotaryEmbedding.forward_oot)",
        "verl_patches.npu_emulation.ops.infer_norm_rope:npu_rotary_embedding",
        "in place: each head's first rot_dim dims rotated by the cache's angle for the token's position, "
        "pairs (i, i + rot_dim/2) neox style, else (2i, 2i + 1)",
        wheel_ops=("atb::_npu_rotary_embedding",),
    ),
    # ---- for vllm-ascend's own tests (tests/vllm_ascend_upstream): paths A3's DeepSeek job does not take ----------
    EmulatedOp(
        "torch_npu.npu_apply_rotary_pos_emb",
        "torch_npu (torch.ops.npu custom op; vllm-ascend rope_forward_oot with precomputed cos/sin: Qwen models)",
        "verl_patches.npu_emulation.ops.apply_rotary_pos_emb:npu_apply_rotary_pos_emb",
        "in place: x = x*cos + cat(-x2, x1)*sin for x = query [B,S,N,D], key [B,S,Nk,D], cos/sin [B,S,1,D]; "
        "float16 in half arithmetic, bfloat16/float32 in float32; layout BSH only",
        wheel_ops=("npu::npu_apply_rotary_pos_emb",),
    ),
    EmulatedOp(
        "torch_npu._npu_flash_attention",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend V1 attention without MLA, prefill without cache)",
        "verl_patches.npu_emulation.ops.paged_attention:npu_flash_attention",
        "per packed sequence: softmax(scale * q k^T, mask[:L, :L] != 0 blocked) v, GQA, into out",
        wheel_ops=("atb::_npu_flash_attention",),
    ),
    EmulatedOp(
        "torch_npu._npu_flash_attention_qlens",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend V1 attention without MLA, prefill with a cache hit)",
        "verl_patches.npu_emulation.ops.paged_attention:npu_flash_attention_qlens",
        "the q_len new tokens of each sequence attend causally (bottom-right) to its kv_len paged tokens; the "
        "mask must be the square causal tile",
        wheel_ops=("atb::_npu_flash_attention_qlens",),
    ),
    EmulatedOp(
        "torch_npu._npu_paged_attention",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend V1 attention without MLA, decode)",
        "verl_patches.npu_emulation.ops.paged_attention:npu_paged_attention",
        "one query token per sequence attends to its context_lens[b] paged tokens, GQA, into out",
        wheel_ops=("atb::_npu_paged_attention",),
    ),
    EmulatedOp(
        "torch_npu._npu_paged_attention_splitfuse",
        "torch_npu ATB (torch.ops.atb custom op; vllm-ascend V1 attention without MLA, chunked prefill)",
        "verl_patches.npu_emulation.ops.paged_attention:npu_paged_attention_splitfuse",
        "query token t of sequence b attends to paged key j < context_lens[b] where mask[t, j] == 0",
        wheel_ops=("atb::_npu_paged_attention_splitfuse",),
    ),
    EmulatedOp(
        "torch.ops._C.rotary_embedding",
        "vllm-ascend's vllm_ascend_C (csrc/torch_binding.cpp; registered on a CPU host only, where it is absent; "
        "called for float16 queries, A3 runs bfloat16)",
        "verl_patches.npu_emulation.ops.vllm_ascend_kernels:rotary_embedding",
        "new [T, N, D] tensors: x[:h]*cos - x[h:r]*sin, x[:h]*sin + x[h:r]*cos, x[r:] copied (r = cache width, "
        "h = r/2); float16 in half arithmetic, bfloat16 in float32 cast toward zero; neox only, head_size % 32 == 0",
    ),
    EmulatedOp(
        "torch.ops._C.get_masked_input_and_mask",
        "vllm-ascend's vllm_ascend_C (csrc/torch_binding.cpp; registered on a CPU host only; A3 computes the mask "
        "in Python)",
        "verl_patches.npu_emulation.ops.vllm_ascend_kernels:get_masked_input_and_mask",
        "VocabParallelEmbedding's shard-local ids and out-of-shard mask, int32 ids below 2**24",
    ),
    EmulatedOp(
        "torch.ops._C.advance_step_flashattn_ascendc",
        "vllm-ascend's vllm_ascend_C (csrc/torch_binding.cpp; registered on a CPU host only; V0 multi-step runner, "
        "A3 runs V1)",
        "verl_patches.npu_emulation.ops.vllm_ascend_kernels:advance_step_flashattn_ascendc",
        "in place for the first num_queries sequences: token := sampled, position := seq_len, seq_len += 1, "
        "slot := block_tables[i, p // bs] * bs + p % bs",
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
        "HCCL communicator names for training's fused collectives (npu_all_gather_base_mm, "
        "npu_mm_reduce_scatter_base, MindSpeed's use_ascend_mc2)",
        "not emulated: the A3 profile does not enable them. The rollout's MC2 dispatch/combine is emulated: gloo "
        "groups get HCCL-style names (ProcessGroup.get_hccl_comm_name, verl_patches/npu_emulation/hccl_names.py)",
    ),
    CpuLimit(
        "NPU streams, events, profiler NPU activity",
        "the host has one stream per device and events record nothing; the profiler records CPU activity only",
    ),
    CpuLimit(
        "the npu device itself (npu tensors, verl_patches/npu_emulation/device: a C++ extension built into the user's "
        "cache)",
        "emulated: npu:N tensors are real PrivateUse1 tensors whose memory is host memory; every op runs the CPU "
        "kernel over the same memory (views stay views, in-place ops write in place), collectives run gloo over it; "
        "one stream per device, events record nothing, the RNG is the host's, memory stats count npu tensors' bytes "
        "(no caching allocator: reserved = allocated); is_available() stays False so device probes keep choosing the "
        "CPU",
    ),
    CpuLimit(
        "vllm-ascend's MC2 kernels beyond the unquantized decode path (quant_mode 2, shared-expert ranks, a TP "
        "domain, A2's expert_scales / expand_scales, v2's shared_expert_x)",
        "not emulated (NotImplementedError). The emulated pairs, v2 (which the torch_npu 2.5.1.post1 wheel has, so "
        "vllm-ascend calls it, as on A3) and v1, move rows with all_to_all_single over gloo on the group "
        "registered under the HCCL name (verl_patches/npu_emulation/hccl_names.py)",
    ),
)


def ops_table() -> list[dict]:
    return [asdict(op) for op in OPS]


def limits_table() -> list[dict]:
    return [asdict(lim) for lim in CPU_LIMITS]


def render_text(width: int = 110) -> str:
    """The catalog for a reader: each op with what provides it, its plain-torch implementation, the formula its
    tests check and the wheel ops it stands in for; then each feature a CPU host cannot run, with the reason."""
    # the command line's needs only: the data above imports nothing
    import textwrap

    def wrap(text: str, **indent: str) -> list[str]:  # names, paths and formulas stay whole
        return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False, **indent)

    def field(label: str, text: str) -> list[str]:
        return wrap(text, initial_indent=f"  {label:<16}", subsequent_indent=" " * 18) or [f"  {label}"]

    lines = [f"{len(OPS)} emulated torch_npu / MindSpeed operations"]
    for op in OPS:
        lines += ["", op.name]
        lines += field("provider", op.provider) + field("implementation", op.implementation)
        lines += field("reference", op.reference)
        if op.wheel_ops:
            lines += field("wheel ops", ", ".join(op.wheel_ops))
    lines += ["", f"{len(CPU_LIMITS)} features that do not run on a CPU host"]
    for lim in CPU_LIMITS:
        lines += [""] + wrap(lim.feature) + field("why", lim.reason)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    # the command line's needs only: the data above imports nothing
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m verl_patches.npu_emulation.catalog", description=__doc__)
    ap.add_argument("--json", action="store_true", help="the same as data: {emulated_ops: [...], cpu_limits: [...]}")
    args = ap.parse_args(argv)
    if args.json:
        print(json.dumps({"emulated_ops": ops_table(), "cpu_limits": limits_table()}, indent=2))
    else:
        print(render_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
