"""Per-die memory model of the DeepSeek-V3 GRPO job: training (Megatron/MindSpeed) and rollout (vLLM).

Pure arithmetic on the HF ``config.json`` dict and the parallel layout; nothing is measured here. The
model is meant to catch layouts that cannot fit before a cluster is booked, not to predict the last
gigabyte: every formula is written out below and every constant is named with where it comes from.

Units: element counts are multiplied by bytes per element (BF16 = 2, FP32 = 4); results are bytes,
reported in GiB (2**30).

Parameters per rank (``rank_params``), MindSpeed-LLM DeepSeek-V3 layout (vendor J2, weights/layout.py):
  * embedding ``V*h/TP`` on the first stage, output layer ``V*h/TP`` + final norm ``h`` on the last;
  * MLA attention per layer: replicated on TP ``(q_lora + kv_lora + rope)*h`` (fused q_a/kv_a
    ``linear_qkv``) + norms ``q_lora + kv_lora + h``; split over TP
    ``heads*(nope+rope)*q_lora`` (q_b) + ``heads*(nope+v)*kv_lora`` (kv_b) + ``h*heads*v`` (o_proj);
  * dense MLP (first ``first_k_dense_replace`` layers): ``3*h*ffn/TP + h``;
  * MoE layer: router ``E*h`` (replicated) + shared experts ``3*h*f*n_shared/TP`` + routed experts
    ``E*3*h*f/(TP*EP)`` (whole experts over TP x EP with TP-extend-EP, or E/EP experts each cut in TP
    slices without it: the same count per rank) + norm ``h``.
  The "expert" part (routed experts) is reduced over the expert-data-parallel group (size DP/EP), the
  "dense" part over the data-parallel group (size DP*CP): that matters for the distributed optimizer.

Training, per rank of the worst pipeline stage (``estimate_training``):
  * params BF16: ``2*P``;
  * grads FP32: ``4*P`` (Megatron's grad buffer; with ``--bf16`` Megatron accumulates and all-reduces
    grads in FP32);
  * optimizer (Adam, FP32 main params + exp_avg + exp_avg_sq = 12 bytes per param):
    distributed optimizer shards it, ``12*(P_dense/(DP*CP) + P_expert/(DP/EP))``; without it ``12*P``.
    MindSpeed's swap optimizer keeps it in host memory and streams ``1/swap_optimizer_times`` of it
    through the device at a time (counted twice for double buffering) during the step only;
    verl's ``optimizer_offload`` keeps it on the host outside the step and brings all of it back for
    the step. Otherwise it stays resident;
  * activations per token per layer (elements, Korthikanti et al. 2022 style, flash attention so no
    ``s^2`` term; with sequence parallelism ``sp = TP`` else 1): see ``layer_activation_elems``;
    1F1B keeps ``min(PP - stage, micro-batches)`` micro-batches in flight on a stage. Full recompute
    with method ``block`` and N layers stores only the input (``h/sp`` per token) of the first N layers
    of the stage; method ``uniform`` stores one input per chunk of N layers; the layer(s) being recomputed
    are added once. Selective recompute is counted as no recompute (it targets the attention score
    matrix, which flash attention never stores);
  * logits on the last stage: FP32 ``tokens*V/TP`` twice (logits and the log-softmax working copy);
  * peak = params + grads + resident optimizer + max(activations, optimizer step transient) + reserve.

Rollout, per die (``estimate_rollout``), vLLM with ``enable_expert_parallel``:
  * weights BF16: embedding and lm_head ``V*h/TP_r``; attention as above with TP_r, plus the MLA
    absorbed copies vLLM derives from kv_b (``heads*(nope+v)*kv_lora/TP_r``); dense MLP ``/TP_r``;
    shared experts ``/TP_r``; routed experts: whole experts over the instance's EP = TP_r * VLLM_DP_SIZE
    ranks, the last rank taking the remainder (vLLM ``determine_expert_map``);
  * workspace: one forward of ``T = max(max_num_batched_tokens, max_num_seqs)`` tokens,
    ``T*(2h + q_lora + kv_lora + rope + heads*(nope+rope+v)/TP_r + topk*(2h + 3f))`` BF16 elements
    (balanced routing assumed; fixed routing is balanced by construction) plus FP32 sampler logits
    ``max_num_seqs*V``;
  * KV cache: MLA latent cache ``(kv_lora + rope) * layers * 2`` bytes per token, replicated on the TP
    ranks of an engine; vLLM gives it ``gpu_memory_utilization * HBM - weights - workspace``. It needs
    at least ``max_model_len`` tokens (else vLLM refuses to start) and ``max_num_seqs * max_model_len``
    to never preempt;
  * outside vLLM's share, ``(1 - gpu_memory_utilization) * HBM`` must hold what the trainer leaves on the
    device during the rollout (actor params/grads unless offloaded, a resident optimizer, the ref
    params unless offloaded) plus the runtime reserve and what the engine holds for its life (below).

Held by the rollout engine for its life, so on the die in every phase (``engine_resident_components``):
  * vllm-ascend's MC2 group (``init_ascend_model_parallel``, group "mc2" over the instance's EP ranks) is an
    HCCL communicator of its own beside vLLM's TP/DP/EP groups; every fused-MoE layer asks for its HCCL
    name when it is built, so its ``2 * HCCL_BUFFSIZE`` MB exist from the engine's build on;
  * the TorchAir graph's memory. torchair's ``StaticNpuGraphExecutor`` (torch_npu 2.5.1.post1,
    dynamo/torchair/core/_npu_graph_executor.so: ``MallocFeatureMemory``, ``AllocAndSetFixedMemory``,
    "No need to refresh feature map addr") takes a graph's feature-map and fixed memory from torch_npu's
    caching allocator at its first run and frees them with the graph; vllm-ascend's ``CompilerConfig`` keeps
    ``memory_efficiency`` off (GE option ``ge.featureBaseRefreshable`` 0). The graphs are captured after the
    KV cache is allocated (vllm-ascend ``capture_model``), so this lies outside vLLM's share, and with one
    graph for every step (weights unfrozen: rollout/graph_binding.py) it stays through training.
    Model (an assumption: GE's memory planner is not run here): GE reuses memory between layers, so a
    graph's feature map is one decoder layer's intermediates at the graph batch ``T``, summed without reuse
    inside the layer (an upper bound for that layer): attention ``T*(2h + q_lora + kv_lora + rope +
    heads/TP_r*(nope + rope + 2*kv_lora + v))`` (absorbed-MLA decode); a MoE layer adds the TP rank's
    ``BS = ceil(T/TP_r)`` tokens in and out ``2h*BS``, MC2's receive rows ``A = BS*EP*min(local experts, K)``
    through the experts ``A*(2h + 3f)`` (a static graph sizes them for the worst case, not for balanced
    routing), shared experts ``T*3*f_s/TP_r`` and MC2's ``assist_info`` (``A*128`` int32); a dense layer adds
    ``T*3*ffn/TP_r``. BF16, the larger layer kind, one feature map per graph batch size. Fixed memory: none
    beyond that (with frozen parameters off the weights are graph inputs, not graph constants); kernel
    workspaces are left to ``CANN_RUNTIME_GIB``.

Reserve (every phase): CANN runtime, workspace and allocator slack ``CANN_RUNTIME_GIB`` (assumption),
plus HCCL buffers: each communicator holds ``2 * HCCL_BUFFSIZE`` MB (CANN HCCL documentation), one per
parallel group of size > 1 the process uses (training TP, PP, DP, EP, TP x EP, expert-DP, world; rollout
TP, DP, EP; the rollout's MC2 group is counted apart, above).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from verl_patches.launch.preflight.mc2_buffer import Mc2Sizes
from verl_patches.reshard.model_dims import ModelDims

GIB = 1024**3
MIB = 1024**2
BF16 = 2
FP32 = 4
ADAM_BYTES_PER_PARAM = 12  # FP32 main param + exp_avg + exp_avg_sq

CANN_RUNTIME_GIB = 1.5  # assumption: CANN context, operator workspace and allocator fragmentation per die
INT32 = 4
MC2_ASSIST_INFO_PER_ROW = 128  # dispatch_v2's assist_info_for_combine: A * 128 int32 (the wheel's Meta function)
SWAP_OPTIMIZER_TIMES = 16  # MindSpeed --swap-optimizer-times default
WARN_MARGIN = 0.10  # a phase within 10 % of the die is a warning


@dataclass(frozen=True)
class DieSpec:
    name: str
    hbm_bytes: int
    source: str


ATLAS_A3_DIE = DieSpec(
    "Atlas A3 NPU die",
    64 * GIB,
    "assumption: an Atlas A3 card carries 2 NPU dies and 128 GB of HBM (Huawei Atlas A3 product "
    "specification), i.e. 64 GiB per die, the capacity npu-smi reports per die; not measured on this "
    "host (override with --die-memory-gib)",
)


@dataclass(frozen=True)
class ParamCount:
    dense: int  # reduced over the data-parallel group
    expert: int  # routed experts, reduced over the expert-data-parallel group

    @property
    def total(self) -> int:
        return self.dense + self.expert

    def __add__(self, other: ParamCount) -> ParamCount:
        return ParamCount(self.dense + other.dense, self.expert + other.expert)


ZERO = ParamCount(0, 0)


def attention_params(m: ModelDims, tp: int) -> int:
    """MLA parameters of one layer held by one TP rank (input_layernorm included)."""
    h = m.hidden
    if m.q_lora_rank:
        replicated = (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim) * h + m.q_lora_rank + m.kv_lora_rank + h
        split = m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * m.q_lora_rank
    else:
        replicated = (m.kv_lora_rank + m.qk_rope_head_dim) * h + m.kv_lora_rank + h
        split = m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim) * h
    split += m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank + h * m.num_heads * m.v_head_dim
    return replicated + split // tp


def mlp_params(m: ModelDims, layer: int, tp: int, ep: int) -> ParamCount:
    """MLP parameters of one layer held by one rank (pre_mlp_layernorm included)."""
    h = m.hidden
    if not m.is_moe(layer):
        return ParamCount(3 * h * m.dense_ffn // tp + h, 0)
    dense = m.num_experts * h + 3 * h * m.shared_ffn // tp + h
    return ParamCount(dense, m.num_experts * 3 * h * m.moe_ffn // (tp * ep))


def stage_layer_ranges(layer_list: tuple[int, ...]) -> list[range]:
    out, start = [], 0
    for n in layer_list:
        out.append(range(start, start + n))
        start += n
    return out


def rank_params(m: ModelDims, tp: int, ep: int, layer_list: tuple[int, ...], stage: int) -> ParamCount:
    """Parameters one training rank of pipeline stage ``stage`` holds."""
    ranges = stage_layer_ranges(layer_list)
    total = ZERO
    for layer in ranges[stage]:
        total = total + ParamCount(attention_params(m, tp), 0) + mlp_params(m, layer, tp, ep)
    if stage == 0:
        total = total + ParamCount(m.vocab_size * m.hidden // tp, 0)
    if stage == len(layer_list) - 1:
        total = total + ParamCount(m.vocab_size * m.hidden // tp + m.hidden, 0)
    return total


def total_params(m: ModelDims) -> int:
    """All parameters of the model (no parallelism): the 671B sanity figure for DeepSeek-V3."""
    return rank_params(m, 1, 1, (m.num_layers,), 0).total


def layer_activation_elems(m: ModelDims, layer: int, tp: int, sequence_parallel: bool, tp_extend_ep: bool) -> float:
    """Elements one training rank stores for backward per token of one layer (see module docstring).

    attention: norm input and linear input ``2h/sp``; q_a and q_norm outputs ``2*q_lora``; kv_a output
    ``kv_lora + rope`` and kv_norm output ``kv_lora`` (replicated on TP); per-head q, k (nope+rope each),
    v and the attention output (``v`` each), ``heads/TP`` of them.
    dense MLP: norm and fc1 inputs ``2h/sp``; fc1 output ``2*ffn/TP``; SwiGLU output ``ffn/TP``.
    MoE: norm and router inputs ``2h/sp``; FP32 router logits ``2*E/sp``; per routed copy (``topk`` per
    token, ``1/TP`` of the tokens per rank with SP and TP-extend-EP) the permuted input ``h``, fc1 output
    ``2f``, SwiGLU output ``f`` and the unpermuted output ``h``; shared experts ``3*f_s/TP``.
    """
    h = m.hidden
    sp = tp if sequence_parallel else 1
    q = 2 * m.q_lora_rank if m.q_lora_rank else 0
    attn = (
        2 * h / sp
        + q
        + (m.kv_lora_rank + m.qk_rope_head_dim)
        + m.kv_lora_rank
        + m.num_heads / tp * (2 * (m.qk_nope_head_dim + m.qk_rope_head_dim) + 2 * m.v_head_dim)
    )
    if not m.is_moe(layer):
        return attn + 2 * h / sp + 3 * m.dense_ffn / tp
    if tp_extend_ep and sequence_parallel:
        routed = m.topk * (2 * h + 3 * m.moe_ffn) / tp
    else:
        routed = m.topk * (2 * h + 3 * m.moe_ffn / tp)
    return attn + 2 * h / sp + 2 * m.num_experts / sp + routed + 3 * m.shared_ffn / tp


@dataclass(frozen=True)
class Recompute:
    granularity: str | None  # None: off; "full" or "selective"
    method: str = "block"  # "block" or "uniform"
    num_layers: int = 1

    @property
    def full(self) -> bool:
        return self.granularity == "full"


@dataclass(frozen=True)
class TrainingSetup:
    """Everything the training estimate reads (built from the verl config by the preflight)."""

    tp: int
    pp: int
    ep: int
    cp: int
    world: int
    layer_list: tuple[int, ...]
    seq_len: int
    micro_batch: int
    micro_batches_per_step: int  # micro-batches per DP rank per optimizer step
    sequence_parallel: bool = True
    tp_extend_ep: bool = True
    distributed_optimizer: bool = True
    swap_optimizer: bool = False
    swap_optimizer_times: int = SWAP_OPTIMIZER_TIMES
    optimizer_offload: bool = False
    param_offload: bool = False
    grad_offload: bool = False
    recompute: Recompute = Recompute(None)
    ref_param_offload: bool = False
    ref_micro_batch: int = 1
    has_ref: bool = True

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


@dataclass(frozen=True)
class RolloutSetup:
    tp: int
    dp_per_instance: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_model_len: int
    max_num_batched_tokens: int
    graph_batch_sizes: tuple[int, ...] = ()  # TorchAir graph batch sizes per DP rank; () when graph mode is off

    @property
    def ep(self) -> int:
        return self.tp * self.dp_per_instance

    @property
    def decode_tokens(self) -> int:
        """Tokens one DP rank runs in a decode step at most: the sequences it holds, padded to a graph batch."""
        return max((self.max_num_seqs, *self.graph_batch_sizes))


@dataclass(frozen=True)
class Component:
    name: str
    nbytes: float
    note: str = ""


@dataclass(frozen=True)
class PhaseEstimate:
    """Peak bytes of one phase on one die, by component, against a budget."""

    phase: str
    components: tuple[Component, ...]
    budget_bytes: float
    budget_note: str
    key: str  # the config key that helps most when this phase does not fit
    detail: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def total_bytes(self) -> float:
        return sum(c.nbytes for c in self.components)

    @property
    def verdict(self) -> str:
        if self.total_bytes > self.budget_bytes:
            return "fail"
        if self.total_bytes > (1 - WARN_MARGIN) * self.budget_bytes:
            return "warn"
        return "ok"


def gib(nbytes: float) -> float:
    return nbytes / GIB


def reserve_components(hbm_buffsize_mb: int, communicators: int) -> tuple[Component, ...]:
    return (
        Component("cann_runtime", CANN_RUNTIME_GIB * GIB, "assumption: CANN context, workspace, fragmentation"),
        Component(
            "hccl_buffers",
            communicators * 2 * hbm_buffsize_mb * MIB,
            f"{communicators} communicators x 2 x HCCL_BUFFSIZE={hbm_buffsize_mb} MB",
        ),
    )


def communicator_count(t: TrainingSetup, r: RolloutSetup | None) -> int:
    """Parallel groups of size > 1 this die communicates in (each holds its own HCCL buffers)."""
    sizes = [t.tp, t.pp, t.dp * t.cp, t.ep, t.tp * t.ep if t.tp_extend_ep else 1, t.dp // max(t.ep, 1), t.world]
    if r is not None:
        sizes += [r.tp, r.dp_per_instance, r.ep]
    return sum(1 for s in sizes if s > 1)


def optimizer_shard_bytes(t: TrainingSetup, p: ParamCount) -> float:
    if t.distributed_optimizer:
        return ADAM_BYTES_PER_PARAM * (p.dense / (t.dp * t.cp) + p.expert / max(t.dp // t.ep, 1))
    return ADAM_BYTES_PER_PARAM * p.total


def stage_in_flight(t: TrainingSetup, stage: int) -> int:
    """Micro-batches whose activations stage ``stage`` holds at once under 1F1B."""
    return max(1, min(t.pp - stage, t.micro_batches_per_step))


def stage_activation_bytes(m: ModelDims, t: TrainingSetup, stage: int) -> tuple[float, float]:
    """(activation bytes at the stage's peak, of which the logits) for one rank of ``stage``."""
    tokens = t.seq_len * t.micro_batch // t.cp  # context parallelism splits the sequence
    layers = list(stage_layer_ranges(t.layer_list)[stage])
    full = [layer_activation_elems(m, i, t.tp, t.sequence_parallel, t.tp_extend_ep) * tokens * BF16 for i in layers]
    sp = t.tp if t.sequence_parallel else 1
    layer_input = m.hidden / sp * tokens * BF16
    rc = t.recompute
    if rc.full and layers:
        n = max(1, rc.num_layers)
        if rc.method == "uniform":
            chunks = math.ceil(len(layers) / n)
            stored = chunks * layer_input
            transient = max(sum(full[i : i + n]) for i in range(0, len(layers), n))
        else:
            k = min(n, len(layers))
            stored = k * layer_input + sum(full[k:])
            transient = max(full[:k]) if k else 0.0
    else:
        stored, transient = sum(full), 0.0
    logits = 0.0
    if stage == t.pp - 1:
        logits = 2 * tokens * m.vocab_size / t.tp * FP32
    return stage_in_flight(t, stage) * stored + transient + logits, logits


def estimate_training(
    m: ModelDims, t: TrainingSetup, die: DieSpec, hccl_buffsize_mb: int, rollout: RolloutSetup | None = None
) -> PhaseEstimate:
    """The worst pipeline stage's peak during the actor update."""
    reserve = reserve_components(hccl_buffsize_mb, communicator_count(t, rollout))
    engine_held = engine_resident_components(m, rollout, hccl_buffsize_mb) if rollout is not None else ()
    best: PhaseEstimate | None = None
    for stage in range(t.pp):
        p = rank_params(m, t.tp, t.ep, t.layer_list, stage)
        opt = optimizer_shard_bytes(t, p)
        if t.swap_optimizer:
            resident, step, opt_note = (
                0.0,
                2 * opt / t.swap_optimizer_times,
                f"swap optimizer: {gib(opt):.1f} GiB on the host, "
                f"2/{t.swap_optimizer_times} of it on the die during the step",
            )
        elif t.optimizer_offload:
            resident, step, opt_note = (
                0.0,
                opt,
                "optimizer_offload: on the host outside the step, all of it on the die during the step",
            )
        else:
            resident, step, opt_note = opt, 0.0, "resident"
        act, logits = stage_activation_bytes(m, t, stage)
        comps = (
            Component("params_bf16", BF16 * p.total, f"{p.total / 1e9:.2f} B params (experts {p.expert / 1e9:.2f} B)"),
            Component("grads_fp32", FP32 * p.total, "Megatron grad buffer (FP32 with --bf16)"),
            Component(
                "optimizer", resident, opt_note + (", distributed" if t.distributed_optimizer else ", not distributed")
            ),
            Component(
                "activations",
                act,
                f"{stage_in_flight(t, stage)} micro-batch(es) x {t.seq_len * t.micro_batch} tokens in flight, "
                f"recompute {t.recompute.granularity or 'off'}"
                + (f"/{t.recompute.method}/{t.recompute.num_layers}" if t.recompute.full else "")
                + (f", logits {gib(logits):.2f} GiB" if logits else ""),
            ),
            Component("optimizer_step_extra", max(0.0, step - act), "step transient beyond the freed activations"),
        )
        comps += reserve + engine_held
        key = _training_key(t, comps)
        est = PhaseEstimate(
            "training",
            comps,
            die.hbm_bytes,
            f"{die.name} HBM {gib(die.hbm_bytes):.0f} GiB",
            key,
            detail=f"worst stage {stage} ({len(stage_layer_ranges(t.layer_list)[stage])} layers)",
            extra={"stage": stage, "optimizer_bytes": opt},
        )
        if best is None or est.total_bytes > best.total_bytes:
            best = est
    assert best is not None
    return best


def _training_key(t: TrainingSetup, comps: tuple[Component, ...]) -> str:
    by = {c.name: c.nbytes for c in comps}
    a = "actor_rollout_ref.actor.megatron"
    largest = max(("params_bf16", "grads_fp32", "optimizer", "activations"), key=lambda n: by[n])
    if largest == "optimizer":
        return f"{a}.swap_optimizer"
    if largest == "activations":
        if not t.recompute.full:
            return "actor_rollout_ref.model.enable_gradient_checkpointing"
        return "actor_rollout_ref.model.gradient_checkpointing_kwargs.activations_checkpoint_num_layers"
    return f"{a}.pipeline_model_parallel_size"


def owned_routed_experts(m: ModelDims, ep: int) -> int:
    """Routed experts on the rollout rank that holds the most: vLLM's ``determine_expert_map`` gives each of
    the EP ranks ``E // EP`` and the last one the remainder (0 when EP exceeds the experts)."""
    return m.num_experts - (ep - 1) * (m.num_experts // ep) if ep <= m.num_experts else 0


def rollout_weight_bytes(m: ModelDims, r: RolloutSetup) -> float:
    """BF16 weights one vLLM rank holds (module docstring), MLA absorbed copies included."""
    h, tp = m.hidden, r.tp
    per_layer_attn = attention_params(m, tp) + m.num_heads * (m.qk_nope_head_dim + m.v_head_dim) * m.kv_lora_rank // tp
    owned = owned_routed_experts(m, r.ep)
    n = 2 * m.vocab_size * h // tp + h
    for layer in range(m.num_layers):
        n += per_layer_attn + h
        if m.is_moe(layer):
            n += m.num_experts * h + 3 * h * m.shared_ffn // tp + owned * 3 * h * m.moe_ffn
        else:
            n += 3 * h * m.dense_ffn // tp
    return BF16 * n


def rollout_parameter_tensors(m: ModelDims) -> int:
    """`nn.Parameter`s of vLLM's DeepSeek-V3 on one rollout rank (what a TorchAir graph takes as inputs
    when parameters are not frozen): per layer the two norms and MLA's seven projections and norms
    (q_a, q_a_layernorm, q_b, kv_a_proj_with_mqa, kv_a_layernorm, kv_b, o); per MoE layer the router's
    weight and bias, the fused expert w13/w2 and the shared experts' gate_up/down; per dense layer its
    gate_up/down; plus embedding, final norm and lm_head. Independent of TP and EP (each rank holds a share
    of every tensor)."""
    q_proj = 3 if m.q_lora_rank else 1  # q_a_proj, q_a_layernorm, q_b_proj, or one q_proj
    per_layer = 2 + q_proj + 4
    moe_layers = sum(1 for layer in range(m.num_layers) if m.is_moe(layer))
    return m.num_layers * per_layer + moe_layers * 6 + (m.num_layers - moe_layers) * 2 + 3


def rollout_workspace_bytes(m: ModelDims, r: RolloutSetup) -> float:
    tokens = max(r.max_num_batched_tokens, r.max_num_seqs)
    h = m.hidden
    per_token = (
        2 * h
        + (m.q_lora_rank or 0)
        + m.kv_lora_rank
        + m.qk_rope_head_dim
        + m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / r.tp
        + m.topk * (2 * h + 3 * m.moe_ffn)
    )
    return tokens * per_token * BF16 + r.max_num_seqs * m.vocab_size * FP32


def rollout_mc2_sizes(m: ModelDims, r: RolloutSetup, decode_tokens: int | None = None) -> Mc2Sizes:
    """MC2's dispatch sizes on one rollout rank in a decode step of ``decode_tokens`` per DP rank (default:
    the most it runs, ``r.decode_tokens``): vllm-ascend pads every DP rank to the largest and splits them over
    the TP ranks before dispatch (fused_moe.py:1371-1396; ``global_bs = ceil(max tokens across DP / TP) * EP``,
    fused_moe.py:155-159)."""
    tokens = r.decode_tokens if decode_tokens is None else decode_tokens
    return Mc2Sizes(
        bs=-(-tokens // r.tp),
        hidden=m.hidden,
        top_k=m.topk,
        ep_world_size=r.ep,
        local_expert_num=max(1, owned_routed_experts(m, r.ep)),
    )


def graph_feature_map_bytes(m: ModelDims, r: RolloutSetup, batch: int) -> float:
    """One TorchAir graph's feature map at graph batch ``batch`` (the model in the module docstring)."""
    h, tp = m.hidden, r.tp
    attention = batch * (
        2 * h
        + (m.q_lora_rank or 0)
        + m.kv_lora_rank
        + m.qk_rope_head_dim
        + m.num_heads / tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + 2 * m.kv_lora_rank + m.v_head_dim)
    )
    kinds = {m.is_moe(layer) for layer in range(m.num_layers)}
    extra = [batch * 3 * m.dense_ffn / tp] if False in kinds else []
    assist = 0.0
    if True in kinds:
        mc2 = rollout_mc2_sizes(m, r, batch)
        rows = mc2.receive_rows
        extra.append(mc2.bs * 2 * h + rows * (2 * h + 3 * m.moe_ffn) + batch * 3 * m.shared_ffn / tp)
        assist = rows * MC2_ASSIST_INFO_PER_ROW * INT32
    return BF16 * (attention + max(extra, default=0.0)) + assist


def torchair_graph_bytes(m: ModelDims, r: RolloutSetup) -> float:
    """What the rollout's TorchAir graphs hold for their life: one feature map per graph batch size."""
    return sum(graph_feature_map_bytes(m, r, batch) for batch in r.graph_batch_sizes)


def engine_resident_components(m: ModelDims, r: RolloutSetup, hccl_buffsize_mb: int) -> tuple[Component, ...]:
    """What the rollout engine keeps on the die in every phase: the MC2 group's HCCL buffers and the TorchAir
    graphs' memory (module docstring)."""
    out = []
    if r.ep > 1 and any(m.is_moe(layer) for layer in range(m.num_layers)):
        out.append(
            Component(
                "hccl_mc2_buffers",
                2 * hccl_buffsize_mb * MIB,
                f"vllm-ascend's MC2 group over EP{r.ep}: a communicator of its own, "
                f"2 x HCCL_BUFFSIZE={hccl_buffsize_mb} MB",
            )
        )
    graph = torchair_graph_bytes(m, r)
    if graph:
        rows = rollout_mc2_sizes(m, r, max(r.graph_batch_sizes)).receive_rows
        out.append(
            Component(
                "torchair_graph",
                graph,
                f"feature map of the graph(s) for batch {list(r.graph_batch_sizes)}: one layer's intermediates, "
                f"the MoE's at MC2's {rows} receive rows (model: memory_estimate)",
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class RolloutEstimate:
    vllm: PhaseEstimate  # weights + workspace + KV against gpu_memory_utilization x HBM
    outside: PhaseEstimate  # what stays on the die outside vLLM's share, against the rest
    kv_cache_bytes: float
    kv_tokens: int
    kv_tokens_needed: int  # max_num_seqs x max_model_len


def estimate_rollout(
    m: ModelDims, t: TrainingSetup, r: RolloutSetup, die: DieSpec, hccl_buffsize_mb: int
) -> RolloutEstimate:
    util_bytes = r.gpu_memory_utilization * die.hbm_bytes
    weights = rollout_weight_bytes(m, r)
    workspace = rollout_workspace_bytes(m, r)
    kv = max(0.0, util_bytes - weights - workspace)
    kv_tokens = int(kv // m.kv_cache_bytes_per_token)
    vllm = PhaseEstimate(
        "rollout",
        (
            Component(
                "weights_bf16",
                weights,
                f"TP{r.tp}, EP{r.ep} ({max(1, m.num_experts // r.ep)} routed expert(s) per rank)",
            ),
            Component(
                "workspace",
                workspace,
                f"forward of {max(r.max_num_batched_tokens, r.max_num_seqs)} tokens + sampler logits",
            ),
        ),
        util_bytes,
        f"gpu_memory_utilization {r.gpu_memory_utilization} x {gib(die.hbm_bytes):.0f} GiB",
        "actor_rollout_ref.rollout.gpu_memory_utilization",
        extra={"kv_bytes": kv},
    )
    stage = max(range(t.pp), key=lambda s: rank_params(m, t.tp, t.ep, t.layer_list, s).total)
    p = rank_params(m, t.tp, t.ep, t.layer_list, stage)
    a = "actor_rollout_ref.actor.megatron"
    comps: list[Component] = []
    if not t.param_offload:
        comps.append(Component("actor_params_bf16", BF16 * p.total, f"{a}.param_offload=False"))
    if not t.grad_offload:
        comps.append(Component("actor_grads_fp32", FP32 * p.total, f"{a}.grad_offload=False"))
    if not (t.swap_optimizer or t.optimizer_offload):
        comps.append(Component("actor_optimizer", optimizer_shard_bytes(t, p), "resident optimizer"))
    if t.has_ref and not t.ref_param_offload:
        comps.append(Component("ref_params_bf16", BF16 * p.total, "actor_rollout_ref.ref.megatron.param_offload=False"))
    comps += reserve_components(hccl_buffsize_mb, communicator_count(t, r))
    comps += engine_resident_components(m, r, hccl_buffsize_mb)
    names = {c.name for c in comps}
    if "actor_params_bf16" in names:
        key = f"{a}.param_offload"
    elif "actor_grads_fp32" in names:
        key = f"{a}.grad_offload"
    elif "ref_params_bf16" in names:
        key = "actor_rollout_ref.ref.megatron.param_offload"
    else:
        key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    outside = PhaseEstimate(
        "rollout_outside_vllm",
        tuple(comps),
        die.hbm_bytes - util_bytes,
        f"(1 - gpu_memory_utilization) x {gib(die.hbm_bytes):.0f} GiB",
        key,
    )
    return RolloutEstimate(vllm, outside, kv, kv_tokens, r.max_num_seqs * r.max_model_len)


def estimate_reshard(
    m: ModelDims, t: TrainingSetup, r: RolloutSetup, die: DieSpec, hccl_buffsize_mb: int
) -> PhaseEstimate:
    """Weight sync: the actor params are still on the die while vLLM's weights are filled (the KV cache
    is allocated only after the actor is offloaded); plus one gathered full tensor (the largest
    non-expert tensor, the vocab x hidden embedding/output layer)."""
    stage = max(range(t.pp), key=lambda s: rank_params(m, t.tp, t.ep, t.layer_list, s).total)
    p = rank_params(m, t.tp, t.ep, t.layer_list, stage)
    comps = [
        Component("actor_params_bf16", BF16 * p.total, f"stage {stage}"),
        Component("rollout_weights_bf16", rollout_weight_bytes(m, r), f"TP{r.tp} EP{r.ep}"),
        Component("gather_buffer", BF16 * m.vocab_size * m.hidden, "largest gathered tensor (vocab x hidden)"),
    ]
    if not t.grad_offload:
        comps.append(Component("actor_grads_fp32", FP32 * p.total, "grad_offload=False"))
    if not (t.swap_optimizer or t.optimizer_offload):
        comps.append(Component("actor_optimizer", optimizer_shard_bytes(t, p), "resident optimizer"))
    comps += reserve_components(hccl_buffsize_mb, communicator_count(t, r))
    comps += engine_resident_components(m, r, hccl_buffsize_mb)
    return PhaseEstimate(
        "reshard",
        tuple(comps),
        die.hbm_bytes,
        f"{die.name} HBM {gib(die.hbm_bytes):.0f} GiB",
        "actor_rollout_ref.rollout.tensor_model_parallel_size",
    )


def estimate_ref(
    m: ModelDims, t: TrainingSetup, die: DieSpec, hccl_buffsize_mb: int, rollout: RolloutSetup | None = None
) -> PhaseEstimate:
    """Reference log-prob pass: ref params, forward-only working set of one layer for the ref
    micro-batch, FP32 logits on the last stage, and whatever the actor leaves on the die."""
    stage = t.pp - 1
    p = rank_params(m, t.tp, t.ep, t.layer_list, stage)
    tokens = t.seq_len * t.ref_micro_batch // t.cp
    layer = max(stage_layer_ranges(t.layer_list)[stage])
    working = layer_activation_elems(m, layer, t.tp, t.sequence_parallel, t.tp_extend_ep) * tokens * BF16
    logits = 2 * tokens * m.vocab_size / t.tp * FP32
    comps = [
        Component("ref_params_bf16", BF16 * p.total, f"stage {stage}"),
        Component("forward_working_set", working, f"one layer, {tokens} tokens"),
        Component("logits_fp32", logits, f"{t.ref_micro_batch} x {t.seq_len} tokens x vocab/TP, x2"),
    ]
    if not t.param_offload:
        comps.append(Component("actor_params_bf16", BF16 * p.total, "param_offload=False"))
    if not t.grad_offload:
        comps.append(Component("actor_grads_fp32", FP32 * p.total, "grad_offload=False"))
    if not (t.swap_optimizer or t.optimizer_offload):
        comps.append(Component("actor_optimizer", optimizer_shard_bytes(t, p), "resident optimizer"))
    comps += reserve_components(hccl_buffsize_mb, communicator_count(t, rollout))
    if rollout is not None:
        comps += engine_resident_components(m, rollout, hccl_buffsize_mb)
    return PhaseEstimate(
        "ref_log_prob",
        tuple(comps),
        die.hbm_bytes,
        f"{die.name} HBM {gib(die.hbm_bytes):.0f} GiB",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    )
