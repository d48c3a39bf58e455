"""`RayPPOTrainer.fit` for the overlay (vendor item A2): verl v0.4.0's loop with the step plan applied.

Differences from upstream, all decided by `step_plan.plan_steps` before the first step:

* the old-log-prob pass runs only when ``actor.recompute_old_log_prob`` is not False (the config checks
  allow False only where it is exact);
* with D2D the ref and update calls get the payloads of `step_payloads` instead of the whole batch, and
  ``trainer.balance_batch`` is never applied (the config checks refuse it);
* every worker call of a step carries the trainer step and the D2D flag in its ``meta_info``
  (`step_payloads.stamp`): the workers record the step in their progress (hang diagnosis), and take part
  in the D2D flow exactly when the driver does (validation's generate, upstream's ``_validate``, carries
  neither);
* every wait on the worker group is bounded (`verl_patches.resilience.worker_deadline`, through the
  patched ``func_generator``): the step the driver is in names the calls that carry no step (checkpoint
  save, validation) in a hang report;
* every step logs the rollout/training log-prob mismatch (`logprob_mismatch`) when the driver holds both
  log-probs; otherwise the actor worker's own report of it passes through update_actor's metrics; once
  logged, `mismatch_gate` judges it against the profile's warning and stop thresholds (a warning line
  for each step above one, the end of the run above the other);
* every step logs the share of its sampled tokens that came from TorchAir graph decode steps
  (`decode_share`: the path A3 makes ~99 % of its tokens on);
* the first step logs the worker classes and the plan, so a run's log says which path ran;
* every step records each worker's peak memory (`rank_memory`) for the golden-metrics check;
* every step prints one compact line for a person watching the run (`step_line`: progress, ETA, throughput,
  reward, validation, mismatch, phase times); the last one draws the run's curves (`plot`, ``curves.png``);
* a checkpoint written in the background (``overlay.async_checkpoint``, `trainer_io.background_saves`) is
  fenced and committed before the next ``update_actor`` and at the end of the run (`checkpoint_fence`); each step
  that saves or fences logs the time it blocked for it (``timing_s/save_checkpoint_blocking``).

Every other line of behaviour (validation, checkpoints, critic, reward model, async rollout, metrics)
follows upstream, calling upstream's helpers through their module so that other patches (step metrics)
apply. REMAX (a second greedy generation per step) is left to upstream's own fit by the wrapper.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any

import numpy as np

from verl_patches.checkpoint import trainer_io
from verl_patches.driver import mismatch_gate
from verl_patches.driver.checkpoint_fence import finish_pending_save
from verl_patches.driver.rank_memory import StepMemory, run_dir
from verl_patches.driver.step_line import step_line
from verl_patches.driver.step_plan import StepPlan
from verl_patches.resilience import worker_deadline
from verl_patches.rollout import decode_share
from verl_patches.sync.path import describe_sync_path
from verl_patches.worker_calls import logprob_mismatch
from verl_patches.worker_calls.step_payloads import ref_payload, stamp, update_payload

logger = logging.getLogger("verl_patches")

GEN_BATCH_KEYS = ("input_ids", "attention_mask", "position_ids")
GEN_NON_TENSOR_KEYS = ("raw_prompt_ids",)
GEN_NON_TENSOR_OPTIONAL = ("multi_modal_data", "raw_prompt", "tools_kwargs")


def _say(line: str) -> None:
    """A line for the trainer log (stdout) and the overlay's logger."""
    logger.warning(line)
    print(line, flush=True)


def worker_summary(trainer: Any, plan: StepPlan) -> str:
    """One line naming what runs: worker classes, groups and the step plan."""
    names = []
    for role, cls in getattr(trainer, "role_worker_mapping", {}).items():
        inner = getattr(cls, "__ray_actor_class__", None) or getattr(cls, "cls", None) or cls
        names.append(
            f"{getattr(role, 'name', role)}={getattr(inner, '__module__', '?')}."
            f"{getattr(inner, '__qualname__', getattr(inner, '__name__', repr(inner)))}"
        )
    fused = getattr(trainer, "ref_policy_wg", None) is getattr(trainer, "actor_rollout_wg", None)
    return (
        f"verl_patches fit: workers [{', '.join(names)}]; ref runs in the actor/rollout worker group: "
        f"{fused and getattr(trainer, 'use_reference_policy', False)}; {plan.describe()}; "
        f"weight sync: {sync_summary(trainer.config)}"
    )


def sync_summary(cfg: Any) -> str:
    """The train -> rollout weight path: ours (verl_patches.sync) on the Megatron path, else verl's own."""
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.driver.config_checks import get

    strategy, rollout = get(cfg, "actor_rollout_ref.actor.strategy"), get(cfg, "actor_rollout_ref.rollout.name")
    if strategy != "megatron":
        return f"verl's {strategy} -> {rollout} sharding manager"

    d = describe_sync_path()
    return f"Megatron -> {rollout}, {d['path']} ({d['flag']})"


def _generation_batch(batch: Any) -> Any:
    non_tensor = list(GEN_NON_TENSOR_KEYS) + [k for k in GEN_NON_TENSOR_OPTIONAL if k in batch.non_tensor_batch]
    return batch.pop(batch_keys=list(GEN_BATCH_KEYS), non_tensor_batch_keys=non_tensor)


def _generate(trainer: Any, gen_batch: Any) -> Any:
    if not trainer.async_rollout_mode:
        return trainer.actor_rollout_wg.generate_sequences(gen_batch)
    trainer.async_rollout_manager.wake_up()
    out = trainer.async_rollout_manager.generate_sequences(gen_batch)
    trainer.async_rollout_manager.sleep()
    return out


def _old_log_prob(trainer: Any, batch: Any, metrics: dict[str, Any]) -> Any:
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo import ray_trainer as rt

    old = trainer.actor_rollout_wg.compute_log_prob(stamp(batch, trainer.global_steps, False))
    entropys = old.batch.pop("entropys")
    entropy = rt.agg_loss(
        loss_mat=entropys,
        loss_mask=batch.batch["response_mask"],
        loss_agg_mode=trainer.config.actor_rollout_ref.actor.loss_agg_mode,
    )
    metrics["actor/entropy_loss"] = entropy.detach().item()
    return batch.union(old)


def _advantages(trainer: Any, batch: Any, reward_tensor: Any, extra: dict[str, list], metrics: dict[str, Any]) -> Any:
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo import ray_trainer as rt

    cfg = trainer.config
    batch.batch["token_level_scores"] = reward_tensor
    if extra:
        batch.non_tensor_batch.update({k: np.array(v) for k, v in extra.items()})
    if cfg.algorithm.use_kl_in_reward:
        batch, kl_metrics = rt.apply_kl_penalty(
            batch, kl_ctrl=trainer.kl_ctrl_in_reward, kl_penalty=cfg.algorithm.kl_penalty
        )
        metrics.update(kl_metrics)
    else:
        batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
    return rt.compute_advantage(
        batch,
        adv_estimator=cfg.algorithm.adv_estimator,
        gamma=cfg.algorithm.gamma,
        lam=cfg.algorithm.lam,
        num_repeat=cfg.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=cfg.algorithm.get("norm_adv_by_std_in_grpo", True),
        multi_turn=cfg.actor_rollout_ref.rollout.multi_turn.enable,
        use_pf_ppo=cfg.algorithm.use_pf_ppo,
        pf_ppo_reweight_method=cfg.algorithm.pf_ppo.reweight_method,
        pf_ppo_weight_pow=cfg.algorithm.pf_ppo.weight_pow,
    )


def run_step(
    trainer: Any, batch: Any, plan: StepPlan, metrics: dict[str, Any], timing_raw: dict[str, float], is_last_step: bool
) -> tuple[Any, Any]:
    """One step on `batch` (a fresh DataProto of prompts); returns (final batch, validation metrics or None)."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo import ray_trainer as rt

    cfg = trainer.config
    timer = rt._timer
    step = trainer.global_steps
    worker_deadline.set_step(step)
    gen_batch = stamp(_generation_batch(batch), step, plan.d2d)
    last_val = None
    with timer("step", timing_raw):
        with timer("gen", timing_raw):
            gen_out = _generate(trainer, gen_batch)
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch.batch))], dtype=object)
        batch = batch.repeat(repeat_times=cfg.actor_rollout_ref.rollout.n, interleave=True)
        batch = batch.union(gen_out)
        batch.batch["response_mask"] = rt.compute_response_mask(batch)
        metrics.update(decode_share.share_metrics(batch))
        if cfg.trainer.balance_batch and not plan.d2d:
            trainer._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(dim=-1).tolist()

        with timer("reward", timing_raw):
            if trainer.use_rm:
                batch = batch.union(trainer.rm_wg.compute_rm_score(batch))
            if cfg.reward_model.launch_reward_fn_async:
                future_reward = rt.compute_reward_async.remote(batch, cfg, trainer.tokenizer)
            else:
                reward_tensor, reward_extra = rt.compute_reward(batch, trainer.reward_fn)

        if not plan.skip_old_log_prob:
            with timer("old_log_prob", timing_raw):
                batch = _old_log_prob(trainer, batch, metrics)

        if trainer.use_reference_policy:
            with timer("ref", timing_raw):
                wg = trainer.actor_rollout_wg if trainer.ref_in_actor else trainer.ref_policy_wg
                batch = batch.union(wg.compute_ref_log_prob(stamp(ref_payload(batch, plan.d2d), step, plan.d2d)))

        if trainer.use_critic:
            with timer("values", timing_raw):
                batch = batch.union(trainer.critic_wg.compute_values(batch))

        with timer("adv", timing_raw):
            if cfg.reward_model.launch_reward_fn_async:
                reward_tensor, reward_extra = ray.get(future_reward)
            batch = _advantages(trainer, batch, reward_tensor, reward_extra, metrics)

        if trainer.use_critic:
            with timer("update_critic", timing_raw):
                critic_out = trainer.critic_wg.update_critic(stamp(batch, step, False))
            metrics.update(rt.reduce_metrics(critic_out.meta_info["metrics"]))

        if cfg.trainer.critic_warmup <= trainer.global_steps:
            _fence_pending_save(trainer, metrics, timing_raw)  # the update changes what the write reads
            with timer("update_actor", timing_raw):
                batch.meta_info["multi_turn"] = cfg.actor_rollout_ref.rollout.multi_turn.enable
                actor_out = trainer.actor_rollout_wg.update_actor(
                    stamp(update_payload(batch, plan.d2d), step, plan.d2d)
                )
            metrics.update(rt.reduce_metrics(actor_out.meta_info["metrics"]))

        metrics.update(logprob_mismatch.batch_mismatch_metrics(batch))

        dump_dir = cfg.trainer.get("rollout_data_dir", None)
        if dump_dir:
            with timer("dump_rollout_generations", timing_raw):
                trainer._dump_generations(
                    inputs=trainer.tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True),
                    outputs=trainer.tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True),
                    scores=batch.batch["token_level_scores"].sum(-1).cpu().tolist(),
                    reward_extra_infos_dict=reward_extra,
                    dump_path=dump_dir,
                )

        if (
            trainer.val_reward_fn is not None
            and cfg.trainer.test_freq > 0
            and (is_last_step or trainer.global_steps % cfg.trainer.test_freq == 0)
        ):
            with timer("testing", timing_raw):
                val_metrics = trainer._validate()
            metrics.update(val_metrics)
            last_val = val_metrics if is_last_step else None

        if cfg.trainer.save_freq > 0 and (is_last_step or trainer.global_steps % cfg.trainer.save_freq == 0):
            with timer("save_checkpoint", timing_raw):
                trainer._save_checkpoint()
        if is_last_step:
            _fence_pending_save(trainer, metrics, timing_raw)  # the run ends with its last save committed
    _blocking_save_time(timing_raw)
    return batch, last_val


def _fence_pending_save(trainer: Any, metrics: dict[str, Any], timing_raw: dict[str, float]) -> None:
    """Wait for the background write of the step saved last and commit it (nothing to do when none is pending)."""
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.trainer.ppo import ray_trainer as rt

    if trainer_io.pending_save(trainer) is None:
        return
    with rt._timer("save_checkpoint_fence", timing_raw):
        metrics.update(finish_pending_save(trainer))


def _blocking_save_time(timing_raw: dict[str, float]) -> None:
    """``timing_s/save_checkpoint_blocking``: the time this step stood still for checkpoints, the save call plus
    the fence (a save in the foreground: all of its time; in the background: its snapshot, and at the fence what
    the write had not finished)."""
    parts = [timing_raw[k] for k in ("save_checkpoint", "save_checkpoint_fence") if k in timing_raw]
    if parts:
        timing_raw["save_checkpoint_blocking"] = sum(parts)


def run_fit(trainer: Any, plan: StepPlan) -> None:
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import OmegaConf

    # lazy: only this path needs tqdm; importing this module stays light
    from tqdm import tqdm

    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl import DataProto
    from verl.trainer.ppo import ray_trainer as rt
    from verl.utils.tracking import Tracking

    cfg = trainer.config
    tracker = Tracking(
        project_name=cfg.trainer.project_name,
        experiment_name=cfg.trainer.experiment_name,
        default_backend=cfg.trainer.logger,
        config=OmegaConf.to_container(cfg, resolve=True),
    )
    summary = worker_summary(trainer, plan)
    logger.warning(summary)
    print(summary, flush=True)
    trainer.global_steps = 0
    trainer._load_checkpoint()
    trainer_io.fence_before_updates(trainer)  # saves may leave their files to the background (overlay key)
    started, step_times = time.monotonic(), []  # this process's steps: the ETA's median and the time "in"
    if trainer.val_reward_fn is not None and cfg.trainer.get("val_before_train", True):
        val_metrics = trainer._validate()
        if not val_metrics:
            raise RuntimeError("validation before training returned no metrics")
        tracker.log(data=val_metrics, step=trainer.global_steps)
        _print_step_line(trainer, val_metrics, [], started)
        if cfg.trainer.get("val_only", False):
            return
    progress = tqdm(total=trainer.total_training_steps, initial=trainer.global_steps, desc="Training Progress")
    trainer.global_steps += 1
    missing_mismatch_reported = False
    step_memory = StepMemory()
    gate = mismatch_gate.thresholds_from_config(cfg)
    for epoch in range(cfg.trainer.total_epochs):
        for batch_dict in trainer.train_dataloader:
            metrics: dict[str, Any] = {}
            timing_raw: dict[str, float] = {}
            is_last_step = trainer.global_steps >= trainer.total_training_steps
            batch, last_val = run_step(
                trainer, DataProto.from_single_dict(batch_dict), plan, metrics, timing_raw, is_last_step
            )
            if logprob_mismatch.ABS_DIFF not in metrics and not missing_mismatch_reported:
                missing_mismatch_reported = True
                logger.warning(
                    "no rollout/training log-prob mismatch this step: the batch lacks %s or %s and "
                    "update_actor reported no %s",
                    logprob_mismatch.ROLLOUT_KEY,
                    logprob_mismatch.TRAIN_KEY,
                    logprob_mismatch.ABS_DIFF,
                )
            metrics.update(step_memory(trainer.actor_rollout_wg, trainer.global_steps))
            metrics.update({"training/global_step": trainer.global_steps, "training/epoch": epoch})
            metrics.update(rt.compute_data_metrics(batch=batch, use_critic=trainer.use_critic))
            metrics.update(rt.compute_timing_metrics(batch=batch, timing_raw=timing_raw))
            metrics.update(
                rt.compute_throughout_metrics(
                    batch=batch, timing_raw=timing_raw, n_gpus=trainer.resource_pool_manager.get_n_gpus()
                )
            )
            tracker.log(data=metrics, step=trainer.global_steps)
            _flush_tensorboard(tracker)
            step_times.append(float(timing_raw.get("step", math.nan)))
            _print_step_line(trainer, metrics, step_times, started)
            mismatch_gate.enforce(mismatch_gate.decide(metrics, gate), trainer.global_steps, _say)
            progress.update(1)
            trainer.global_steps += 1
            if is_last_step:
                print(f"Final validation metrics: {last_val}", flush=True)
                progress.close()
                _draw_curves(tracker)
                return


def _print_step_line(trainer: Any, metrics: dict[str, Any], step_times: list[float], started: float) -> None:
    line = step_line(
        metrics, trainer.global_steps, trainer.total_training_steps, step_times, time.monotonic() - started
    )
    print(line, flush=True)


def _flush_tensorboard(tracker: Any) -> None:
    """verl's TensorBoard writer flushes only every two minutes: a step's scalars reach the file when it is logged,
    so TensorBoard shows each step at once and a run killed mid-step keeps every step it logged."""
    writer = getattr(getattr(tracker, "logger", {}).get("tensorboard"), "writer", None)
    if writer is not None:
        writer.flush()


def _draw_curves(tracker: Any) -> None:
    """The run's curves into its folder, from the TensorBoard events verl's tracker wrote (flushed at each step)."""
    # lazy: drawing loads Pillow and TensorBoard's reader, once, at the end of the run
    from verl_patches.driver import plot

    print(plot.end_of_run(run_dir()), flush=True)
