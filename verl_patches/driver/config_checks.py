"""Semantic checks of a composed trainer config that Hydra cannot express; each error names the key."""

from __future__ import annotations

from collections.abc import Mapping

from omegaconf import DictConfig

from verl_patches.base.config_access import get  # noqa: F401  (its readers import it from here too)
from verl_patches.base.env_flags import EnvError
from verl_patches.base.job_layout import PP_KEY, JobLayoutError, job_layout
from verl_patches.driver.logger_backends import logger_backend_problems
from verl_patches.driver.mismatch_gate import GateConfigError, thresholds_from_config
from verl_patches.driver.rollout_settings import GRAPH, SCHEDULER, chunked_prefill_reason, rollout_problems
from verl_patches.driver.step_plan import FUSED_ROLE_KEY, d2d_setting
from verl_patches.rollout.kv_nz_switch import kv_nz_wanted
from verl_patches.worker_calls.env_names import KV_NZ_FLAG
from verl_patches.worker_calls.rollout_correction import CAP_KEY, ROLLOUT_LOG_PROBS, cap_problem


class OverlayConfigError(ValueError):
    pass


def check_config(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """Return the problems found (empty when the config is consistent); `environ` (default os.environ)
    is where D2D_DATA_TRANSFER (which overrides overlay.d2d_tensor_cache) is read."""
    problems: list[str] = []
    a = "actor_rollout_ref.actor"
    if get(cfg, f"{a}.recompute_old_log_prob") is False:
        # Skipping old_log_prob uses old = current policy (detached): exact only on-policy.
        if get(cfg, "algorithm.adv_estimator") != "grpo":
            problems.append(
                f"{a}.recompute_old_log_prob=False needs algorithm.adv_estimator=grpo "
                f"(found {get(cfg, 'algorithm.adv_estimator')})"
            )
        if get(cfg, f"{a}.ppo_epochs") != 1:
            problems.append(
                f"{a}.recompute_old_log_prob=False needs {a}.ppo_epochs=1 "
                f"(found {get(cfg, f'{a}.ppo_epochs')}): a second epoch is off-policy"
            )
        if get(cfg, "data.train_batch_size") != get(cfg, f"{a}.ppo_mini_batch_size"):
            problems.append(
                f"{a}.recompute_old_log_prob=False needs data.train_batch_size "
                f"({get(cfg, 'data.train_batch_size')}) == {a}.ppo_mini_batch_size "
                f"({get(cfg, f'{a}.ppo_mini_batch_size')}): one optimizer step per rollout"
            )
        if get(cfg, f"{a}.strategy") != "megatron":
            # verl's FSDP actor reads old_log_probs from the batch; only our Megatron actor (C3) reuses
            # its own detached log-probs.
            problems.append(
                f"{a}.recompute_old_log_prob=False needs {a}.strategy=megatron "
                f"(found {get(cfg, f'{a}.strategy')}): verl's FSDP actor needs old_log_probs"
            )
        if get(cfg, "actor_rollout_ref.rollout.mode", "sync") != "sync":
            problems.append(
                f"{a}.recompute_old_log_prob=False needs actor_rollout_ref.rollout.mode=sync "
                f"(found {get(cfg, 'actor_rollout_ref.rollout.mode')})"
            )
    problems += d2d_problems(cfg, environ)
    m = f"{a}.megatron"
    if get(cfg, f"{m}.swap_optimizer") and get(cfg, f"{m}.optimizer_offload"):
        problems.append(f"{m}.swap_optimizer=True replaces optimizer offload: set {m}.optimizer_offload=False")
    if get(cfg, f"{m}.swap_optimizer") and get(cfg, f"{m}.params_dtype") in ("float32", "fp32"):
        # MindSpeed v2.0.0 creates the swapped Adam states only for the fp32 main copies of bf16/fp16
        # parameters; with fp32 parameters its step finds none (KeyError 'exp_avg' at the first update)
        problems.append(
            f"{m}.swap_optimizer=True needs bf16 parameters: MindSpeed's swap optimizer keeps no Adam "
            f"state for {m}.params_dtype=float32; set one of them off"
        )
    problems += layout_problems(cfg)
    layers = get(cfg, f"{m}.pipeline_parallel_num_layer_list")
    if layers is not None:
        layout = None if layout_problems(cfg) else job_layout(cfg)  # a refused layout is its own problem
        if layout is not None and len(layers) != layout.training.pp:
            problems.append(
                f"{m}.pipeline_parallel_num_layer_list has {len(layers)} entries but {PP_KEY}={layout.training.pp}"
            )
        if any((not isinstance(n, int)) or n < 1 for n in layers):
            problems.append(f"{m}.pipeline_parallel_num_layer_list entries must be positive integers: {list(layers)}")
        vpp = get(cfg, f"{m}.virtual_pipeline_model_parallel_size")
        if vpp not in (None, 1):
            problems.append(
                f"{m}.pipeline_parallel_num_layer_list cannot be combined with "
                f"{m}.virtual_pipeline_model_parallel_size={vpp}"
            )
    if get(cfg, f"{a}.entropy_coeff", 0) not in (0, 0.0) and get(cfg, f"{a}.strategy") == "megatron":
        problems.append(f"{a}.entropy_coeff must be 0 on the Megatron path (entropy is not back-propagated there)")
    problems += rollout_problems(cfg)
    problems += mismatch_gate_problems(cfg)
    problems += rollout_correction_problems(cfg)
    problems += kv_nz_problems(cfg)
    problems += logger_backend_problems(cfg)  # verl imports a backend only after every worker is up
    return problems


def layout_problems(cfg: DictConfig) -> list[str]:
    """The job's parallel layout (`base.job_layout`): one problem naming the key, or none."""
    try:
        job_layout(cfg)
    except JobLayoutError as err:
        return [str(err)]
    return []


def kv_nz_problems(cfg: DictConfig) -> list[str]:
    """F4 (the KV-NZ fix, installed where graph mode and `enable_kv_nz` are on) is refused together with
    chunked prefill. In a step that mixes prefill chunks with decodes (vllm-ascend 0.9.1 mla_v1 `forward`,
    attn_state ChunkedPrefill, graph mode on but the step eager) the decode tokens' KV is written only by
    `_npu_reshape_and_cache`, which F4 drops because it would write ND into the NZ cache; and the chunk's
    context is read back by `npu_paged_cache_load`, which reads ND only. The preflight reports this through
    `check_config` as the job does, so the dry run and the job refuse the same configs."""
    if not kv_nz_wanted(get(cfg, GRAPH)):
        return []
    why = chunked_prefill_reason(cfg)
    if why is None:
        return []
    return [
        f"{GRAPH}.enable_kv_nz=True (F4, exported as {KV_NZ_FLAG}=1) with chunked prefill on ({why}): in steps "
        f"that mix prefill chunks with decodes F4 drops the decode tokens' only KV-cache write and "
        f"npu_paged_cache_load reads the cache as ND only; set enable_kv_nz=False, or turn chunked prefill off "
        f"({SCHEDULER}.enabled=True with enable_chunked_prefill=False there and in actor_rollout_ref.rollout, "
        f"max_num_batched_tokens >= max_model_len)"
    ]


def d2d_problems(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> list[str]:
    """With the D2D tensor cache on (overlay.d2d_tensor_cache, or D2D_DATA_TRANSFER which overrides it),
    the driver never holds input_ids, position_ids, ref_log_prob or old_log_probs, and the workers rely on
    the row order of generate: everything that needs one of those on the driver is refused here, each
    naming its key and what turned the cache on."""
    # lazy: that module loads torch; importing this one must not
    from verl_patches.reshard.tensor_cache import PRECONDITIONS

    try:
        on, source = d2d_setting(cfg, environ)
    except EnvError as err:  # a value that is neither on nor off: the switch itself is the problem
        return [str(err)]
    if not on:
        return []
    problems = []
    why = f"with the D2D tensor cache on ({source})"
    for key, (want, reason) in PRECONDITIONS.items():
        found = get(cfg, key)
        if found != want:
            problems.append(f"{key}={found!r} {why}: {reason}")
    rules = (
        (
            "actor_rollout_ref.actor.recompute_old_log_prob",
            False,
            "the old-log-prob pass would need input_ids on the driver",
        ),
        (FUSED_ROLE_KEY, True, "generate, ref and update must run in one worker group to share the cache"),
        ("reward_model.enable", False, "a reward model worker reads input_ids from the driver's batch"),
        ("actor_rollout_ref.rollout.mode", "sync", "the async rollout server does not fill the cache"),
    )
    for key, want, reason in rules:
        found = get(cfg, key)
        if found != want:
            problems.append(f"{key}={found!r} {why} must be {want!r}: {reason}")
    return problems


def mismatch_gate_problems(cfg: DictConfig) -> list[str]:
    """The rollout-mismatch gate's thresholds, read by the one reader the fit loop uses."""
    try:
        thresholds_from_config(cfg)
    except GateConfigError as err:
        return [str(err)]
    return []


# rollouts whose generate_sequences returns the sampled tokens' log-probs (rollout_log_probs) in verl v0.4.0
ROLLOUTS_WITH_LOG_PROBS = ("vllm",)


def rollout_correction_problems(cfg: DictConfig) -> list[str]:
    """TIS (actor.rollout_correction.tis_cap) weighs each token against the rollout's log-probs: only our
    Megatron actor applies it, and only a rollout that returns those log-probs in the batch can feed it."""
    cap = get(cfg, CAP_KEY)
    problem = cap_problem(cap)
    if problem:
        return [problem]
    if cap is None:
        return []
    problems = []
    strategy = get(cfg, "actor_rollout_ref.actor.strategy")
    if strategy != "megatron":
        problems.append(
            f"{CAP_KEY}={cap} needs actor_rollout_ref.actor.strategy=megatron (found {strategy}): only the "
            f"Megatron actor applies TIS; set {CAP_KEY}=null"
        )
    name, mode = get(cfg, "actor_rollout_ref.rollout.name"), get(cfg, "actor_rollout_ref.rollout.mode", "sync")
    if name not in ROLLOUTS_WITH_LOG_PROBS or mode != "sync":
        problems.append(
            f"{CAP_KEY}={cap} needs the rollout's log-probs in the batch ({ROLLOUT_LOG_PROBS}), which only "
            f"actor_rollout_ref.rollout.name={'|'.join(ROLLOUTS_WITH_LOG_PROBS)} with "
            f"actor_rollout_ref.rollout.mode=sync returns (found name={name}, mode={mode}); set {CAP_KEY}=null"
        )
    return problems


def raise_on_problems(cfg: DictConfig, environ: Mapping[str, str] | None = None) -> None:
    problems = check_config(cfg, environ)
    if problems:
        raise OverlayConfigError("inconsistent trainer config:\n  - " + "\n  - ".join(problems))
