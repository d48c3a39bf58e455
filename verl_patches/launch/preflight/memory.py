"""Preflight: the per-die memory estimate of a composed config, as findings (the model: memory_estimate)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_patches.base.job_layout import job_layout
from verl_patches.base.strict_int import IntError, parse_int
from verl_patches.driver.rollout_settings import GRAPH
from verl_patches.launch.job_env import STATIC_VARS
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, Context, Finding, get
from verl_patches.launch.preflight.layout import A, M, R
from verl_patches.launch.preflight.memory_estimate import (
    DieSpec,
    PhaseEstimate,
    Recompute,
    RolloutSetup,
    TrainingSetup,
    estimate_ref,
    estimate_reshard,
    estimate_rollout,
    estimate_training,
    gib,
    rollout_parameter_tensors,
    rollout_weight_bytes,
)
from verl_patches.launch.settings import ClusterSettings
from verl_patches.reshard.model_dims import ModelDims


def training_setup(cfg: Any, model: Mapping[str, Any]) -> TrainingSetup:
    """The training side of the estimate; the layout must hold (`job_layout`: the preflight runs the estimate
    only after the layout.* checks pass)."""
    layout = job_layout(cfg)
    t = layout.training
    sz, world, dp = {"tp": t.tp, "pp": t.pp, "ep": t.ep, "cp": t.cp}, layout.world, t.dp
    n = int(get(cfg, f"{R}.n"))
    micro = int(get(cfg, f"{A}.ppo_micro_batch_size_per_gpu") or 1)
    lst = get(cfg, f"{M}.pipeline_parallel_num_layer_list")
    layers = int(model["num_hidden_layers"])
    layer_list = tuple(int(x) for x in lst) if lst else (layers // sz["pp"],) * sz["pp"]
    rc = Recompute(None)
    if get(cfg, "actor_rollout_ref.model.enable_gradient_checkpointing"):
        kw = get(cfg, "actor_rollout_ref.model.gradient_checkpointing_kwargs") or {}
        rc = Recompute(
            kw.get("activations_checkpoint_granularity") or "full",
            kw.get("activations_checkpoint_method") or "block",
            int(kw.get("activations_checkpoint_num_layers") or 1),
        )
    return TrainingSetup(
        tp=sz["tp"],
        pp=sz["pp"],
        ep=sz["ep"],
        cp=sz["cp"],
        world=world,
        layer_list=layer_list,
        seq_len=int(get(cfg, "data.max_prompt_length")) + int(get(cfg, "data.max_response_length")),
        micro_batch=micro,
        micro_batches_per_step=max(1, int(get(cfg, f"{A}.ppo_mini_batch_size")) * n // max(dp, 1) // micro),
        sequence_parallel=bool(get(cfg, f"{M}.sequence_parallel")) and sz["tp"] > 1,
        tp_extend_ep=True,  # our MindSpeed argument translation always enables --moe-tp-extend-ep (D1)
        distributed_optimizer=bool(get(cfg, f"{M}.use_distributed_optimizer", True)),
        swap_optimizer=bool(get(cfg, f"{M}.swap_optimizer")),
        optimizer_offload=bool(get(cfg, f"{M}.optimizer_offload")),
        param_offload=bool(get(cfg, f"{M}.param_offload")),
        grad_offload=bool(get(cfg, f"{M}.grad_offload")),
        recompute=rc,
        ref_param_offload=bool(get(cfg, "actor_rollout_ref.ref.megatron.param_offload")),
        ref_micro_batch=int(get(cfg, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu") or 1),
        has_ref=bool(get(cfg, f"{A}.use_kl_loss") or get(cfg, "algorithm.use_kl_in_reward")),
    )


def graph_batch_sizes(cfg: Any) -> tuple[int, ...]:
    """The TorchAir graph batch sizes the rollout compiles; () when graph mode is off."""
    graph = get(cfg, GRAPH) or {}
    if not graph.get("enabled"):
        return ()
    return tuple(int(x) for x in graph.get("graph_batch_sizes") or ())


def rollout_setup(cfg: Any) -> RolloutSetup:
    """The rollout side of the estimate, for a layout that holds (as `training_setup`)."""
    rollout = job_layout(cfg).rollout
    engines = rollout.dp
    seqs = int(get(cfg, "data.train_batch_size")) * int(get(cfg, f"{R}.n"))
    max_len = int(get(cfg, f"{R}.max_model_len") or 0) or int(get(cfg, "data.max_prompt_length")) + int(
        get(cfg, "data.max_response_length")
    )
    return RolloutSetup(
        tp=rollout.tp,
        dp_per_instance=rollout.dp_per_instance,
        gpu_memory_utilization=float(get(cfg, f"{R}.gpu_memory_utilization")),
        max_num_seqs=max(1, seqs // engines),
        max_model_len=max_len,
        max_num_batched_tokens=int(get(cfg, f"{R}.max_num_batched_tokens") or max_len),
        graph_batch_sizes=graph_batch_sizes(cfg),
    )


def _table(est: PhaseEstimate) -> str:
    parts = ", ".join(f"{c.name} {gib(c.nbytes):.1f}" for c in est.components if c.nbytes)
    return f"{gib(est.total_bytes):.1f} GiB of {gib(est.budget_bytes):.1f} GiB ({est.budget_note}): {parts}"


def _finding(check: str, est: PhaseEstimate, prefix: str = "") -> Finding:
    verdict = est.verdict
    msg = prefix + _table(est)
    if verdict == WARN:
        msg += " — within 10 % of the budget"
    return Finding(check, verdict, msg, est.key if verdict != OK else "")


def job_hccl_buffsize() -> str:
    """The HCCL_BUFFSIZE the job exports when the env file sets none (launch/job_env.py)."""
    return next(v.value for v in STATIC_VARS if v.name == "HCCL_BUFFSIZE")


def hccl_buffsize_setting(settings: ClusterSettings) -> tuple[str, str]:
    """HCCL_BUFFSIZE as the job exports it, and where it comes from: the env file's value wins over the job's
    own, as in ``job_env.job_environment``."""
    raw = settings.get("HCCL_BUFFSIZE")
    if raw is not None:
        return raw, settings.where("HCCL_BUFFSIZE")
    return job_hccl_buffsize(), "the job's own, launch/job_env.py"


def hccl_buffsize(ctx: Context) -> int:
    """HCCL_BUFFSIZE in MB for the estimate. A value that is not a positive integer is the MC2 check's failure
    (`mc2.mc2_buffer_findings`); the estimate then uses the job's own."""
    raw, _ = hccl_buffsize_setting(ctx.settings)
    try:
        value = parse_int(raw, "HCCL_BUFFSIZE")
    except IntError:
        value = 0
    return value if value > 0 else int(job_hccl_buffsize())


def memory_findings(ctx: Context, model: Mapping[str, Any], die: DieSpec) -> list[Finding]:
    cfg = ctx.cfg
    if not ctx.megatron:
        return [
            Finding(
                "memory",
                OK,
                "n/a: the per-die model covers the Megatron/vLLM path; this profile's "
                f"{get(cfg, 'actor_rollout_ref.actor.strategy')} actor runs in host memory",
            )
        ]
    out = [Finding("memory.die", OK, f"{die.name}: {gib(die.hbm_bytes):.0f} GiB HBM — {die.source}")]
    m = ModelDims.from_hf_config(model)
    t = training_setup(cfg, model)
    buf = hccl_buffsize(ctx)
    vllm = get(cfg, f"{R}.name") == "vllm"
    r = rollout_setup(cfg) if vllm else None
    tr = estimate_training(m, t, die, buf, r)
    out.append(_finding("memory.training", tr, f"{tr.detail}, {t.seq_len} tokens per sequence: "))
    out.append(_finding("memory.ref_log_prob", estimate_ref(m, t, die, buf, r)))
    if r is None:
        return out
    out.append(_finding("memory.reshard", estimate_reshard(m, t, r, die, buf)))
    ro = estimate_rollout(m, t, r, die, buf)
    kv_msg = (
        f"; KV cache {gib(ro.kv_cache_bytes):.1f} GiB = {ro.kv_tokens} tokens at "
        f"{m.kv_cache_bytes_per_token} B/token (MLA latent), needed {r.max_num_seqs} seqs x "
        f"{r.max_model_len} = {ro.kv_tokens_needed}"
    )
    v = ro.vllm
    if v.verdict == FAIL:
        out.append(Finding("memory.rollout", FAIL, _table(v) + ": no room for any KV cache", v.key))
    elif ro.kv_tokens < r.max_model_len:
        out.append(
            Finding(
                "memory.rollout",
                FAIL,
                _table(v) + kv_msg + ": not even one sequence fits, vLLM refuses to start",
                v.key,
            )
        )
    elif ro.kv_tokens < ro.kv_tokens_needed:
        out.append(Finding("memory.rollout", WARN, _table(v) + kv_msg + ": vLLM will preempt and recompute", v.key))
    else:
        out.append(Finding("memory.rollout", OK, _table(v) + kv_msg))
    out.append(_finding("memory.rollout_outside_vllm", ro.outside))
    out.append(graph_rebuild_finding(cfg, tr, rollout_weight_bytes(m, r), die, rollout_parameter_tensors(m)))
    return out


# vllm-ascend's own log line for a TorchAir capture: "this usually takes 0.5~1.5 mins" per graph batch size
TORCHAIR_CAPTURE_MIN = (0.5, 1.5)
# Host time TorchAir spends per graph input per run to take its current address (an assumption for the
# estimate, not measured on A3): what unfrozen parameters add to every decode step
INPUT_REFRESH_US = (1.0, 3.0)


def graph_rebuild_finding(
    cfg: Any, training: PhaseEstimate, rollout_weights: float, die: DieSpec, parameter_tensors: int
) -> Finding:
    """What the rollout's weight lifecycle costs under TorchAir graph mode (rollout/graph_binding.py, the
    unfrozen-parameters patch): no device memory, no graph rebuild, every decode step refreshes the weights'
    addresses; and what the alternatives would cost (frozen parameters: a compile per step; resident weights)."""
    extra = get(cfg, f"{R}.engine_kwargs.vllm.additional_config") or {}
    graph = (extra.get("torchair_graph_config") or {}) if hasattr(extra, "get") else {}
    if not graph.get("enabled"):
        return Finding(
            "memory.rollout_weight_lifecycle",
            OK,
            "eager rollout (no TorchAir graph): the rollout's "
            f"weights ({gib(rollout_weights):.1f} GiB) are released for training and reloaded each step",
        )
    sizes = len(list(graph.get("graph_batch_sizes") or [1]))
    low, high = (round(x * sizes, 1) for x in TORCHAIR_CAPTURE_MIN)
    decode_steps = int(get(cfg, f"{R}.response_length", 0) or get(cfg, "data.max_response_length", 0) or 0)
    refresh = [round(us * 1e-6 * parameter_tensors * decode_steps, 1) for us in INPUT_REFRESH_US]
    resident = training.total_bytes + rollout_weights
    return Finding(
        "memory.rollout_weight_lifecycle",
        OK,
        f"rollout weights {gib(rollout_weights):.1f} GiB per die released for training and re-allocated each "
        f"step; TorchAir graphs take them as inputs (frozen_parameter off: vllm_ascend.model_runner_v1."
        f"torchair_unfrozen_parameters), so nothing is rebuilt: 0 GiB, about {refresh[0]}-{refresh[1]} s per step "
        f"to refresh {parameter_tensors} weight addresses at each of {decode_steps} decode steps "
        f"({INPUT_REFRESH_US[0]:g}-{INPUT_REFRESH_US[1]:g} us per input, assumed, not measured). Frozen "
        f"parameters instead: the {sizes} graph(s) compiled again each step, about {low}-{high} min per step "
        f"(vllm-ascend's capture time); weights kept resident instead: training at {gib(resident):.1f} GiB of "
        f"{gib(die.hbm_bytes):.0f} GiB",
    )
