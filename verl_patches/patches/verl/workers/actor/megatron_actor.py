"""C3: verl's ``MegatronPPOActor`` on core_r0.8.0 + MindSpeed-LLM, with the rollout's temperature.

Changes against verl v0.4.0, each for a reason:

- The logits are divided by the sampling temperature before log-probs and entropy, as verl's FSDP actor
  does and as the rollout samples; verl's Megatron actor never did, so at the A3 profile's 0.9 the GRPO
  ratio and the KL term compared log-probs of two different distributions. The temperature comes from the
  batch's ``meta_info["temperature"]`` (the worker sets it from ``rollout.temperature``); it is required,
  so a missing value is an error instead of a silent 1.0.
- ``recompute_old_log_prob=False`` (the A3 profile) skips the old-log-prob forward pass: with one PPO epoch
  and one mini-batch the policy that sampled is the one being updated, so ``old = current.detach()``
  exactly; ``compute_log_prob`` returns zeros for that role and marks the batch so.
- The forward is the non-packed one with the NPU flash-attention mask (G11); ``use_packed_seq=True`` is
  refused at construction. ``use_dynamic_bsz`` packs micro-batches up to ``max_packing_token_size``.
- ``entropy_coeff`` must be 0 (the recipe's loss has no entropy term and the A3 profile sets 0).
- With ``rollout_correction.tis_cap`` set (the A3 profiles), each token's policy-gradient term is weighted by
  truncated importance sampling against the rollout's log-probs (`rollout_correction`): the samples came
  from the rollout engine's numerics, not the actor's, which the ratio of a skipped old-log-prob pass
  (exactly 1) cannot see.
- ``update_policy`` counts optimizer steps, traces the second one when ``PROFILE_UPDATE=1`` (C9) and empties
  the device cache at the end (C8).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

from verl_patches import profiler as npu_profiler  # read at call time: tests put a fake NPUProfiler there
from verl_patches.patches.verl.models.model_forward import PackedSequencesUnsupported
from verl_patches.patches.verl.workers.actor import rollout_correction
from verl_patches.tools import empty_cache

NOT_RECOMPUTED = "old_log_probs_not_recomputed"  # meta_info flag on the batch compute_log_prob returns


class TemperatureMissing(KeyError):
    """The batch does not say at which temperature the rollout sampled."""


def temperature_of(meta_info: dict) -> float:
    if "temperature" not in meta_info:
        raise TemperatureMissing(
            "meta_info['temperature'] is missing: the actor's log-probs must use the rollout's sampling "
            "temperature (actor_rollout_ref.rollout.temperature); the worker sets it on every batch"
        )
    t = float(meta_info["temperature"])
    if not t > 0:
        raise ValueError(f"meta_info['temperature']={t}: the sampling temperature must be > 0")
    return t


def tempered(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``logits / temperature``, out of place (the logits feed the output layer's backward)."""
    return logits if temperature == 1.0 else logits / temperature


ROLLOUT_LOG_PROBS = "rollout_log_probs"


def minibatch_keys(recompute_old_log_prob: bool, use_kl_loss: bool) -> list[str]:
    keys = ["responses", "input_ids", "attention_mask", "position_ids", "advantages"]
    if recompute_old_log_prob:
        keys.append("old_log_probs")
    if use_kl_loss:
        keys.append("ref_log_prob")
    return keys


def dynamic_bsz_token_budget(config: Any, forward_only: bool, meta_max_token_len: int | None) -> int | None:
    """Tokens per micro-batch with ``use_dynamic_bsz``: ``max_packing_token_size`` when set, else verl's own."""
    own = config.get("max_packing_token_size", None)
    if own:
        return int(own) * config.megatron.context_parallel_size
    if forward_only:
        return meta_max_token_len
    return config.ppo_max_token_len_per_gpu * config.megatron.context_parallel_size


def wrap_init(original: Callable) -> Callable:
    def __init__(self, config, *args: Any, **kwargs: Any) -> None:
        if config.get("use_packed_seq", False):
            raise PackedSequencesUnsupported(
                "use_packed_seq=True: packed sequences are not supported for DeepSeek-V3 on core_r0.8.0 + "
                "MindSpeed-LLM (its MLA takes no packed_seq_params); set it to False"
            )
        if config.get("entropy_coeff", 0) not in (0, None) and kwargs.get("actor_optimizer", None) is not None:
            raise ValueError(
                f"entropy_coeff={config.entropy_coeff}: the Megatron actor's loss has no entropy term "
                "on this stack; set actor_rollout_ref.actor.entropy_coeff=0"
            )
        original(self, config, *args, **kwargs)
        self.iteration = 0  # optimizer steps taken, for step-scoped profiling

    return __init__


def compute_log_prob(self, data: Any, calculate_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state as mpu

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.seqlen_balancing import get_reverse_idx

    data.batch = data.batch.contiguous()
    responses = data.batch["responses"]
    batch_size, response_length = responses.shape
    device = responses.device
    if not self.config.get("recompute_old_log_prob", True):
        # the caller uses current.detach() in the loss instead; nothing here is read as a log-prob
        data.meta_info[NOT_RECOMPUTED] = True
        zeros = torch.zeros(batch_size, response_length, dtype=torch.float32, device=device)
        return zeros, zeros.clone()

    # the worker says per call; the role's own use_dynamic_bsz (our key for the reference) is the default
    use_dynamic_bsz = bool(data.meta_info.get("use_dynamic_bsz", self.config.get("use_dynamic_bsz", False)))
    micro_batch_size = data.meta_info.get("micro_batch_size", None)
    if micro_batch_size is None and not use_dynamic_bsz:
        raise ValueError("meta_info['micro_batch_size'] is needed to compute log-probs")
    max_token_len = (
        dynamic_bsz_token_budget(self.config, True, data.meta_info.get("max_token_len", None))
        if use_dynamic_bsz
        else None
    )

    def keep_log_probs(output: dict, data: dict) -> dict:
        return {"log_probs": output["log_probs"][:, -response_length - 1 : -1].contiguous()}

    with torch.no_grad():
        out = self.forward_backward_batch(
            data,
            forward_only=True,
            post_process_fn=keep_log_probs,
            calculate_entropy=calculate_entropy,
            use_dynamic_bsz=use_dynamic_bsz,
            micro_batch_size=micro_batch_size,
            max_token_len=max_token_len,
        )
        last = mpu.is_pipeline_last_stage(ignore_virtual=True)
        revert = None
        if last and use_dynamic_bsz:
            indices = list(itertools.chain.from_iterable(out["indices"]))
            revert = torch.tensor(get_reverse_idx(indices), dtype=torch.long)

        def gather(pick: Callable[[Any], torch.Tensor]) -> torch.Tensor:
            if last:
                t = torch.cat([pick(o) for o in out["output"]], dim=0).to(torch.float32)
                t = t[revert] if revert is not None else t
            else:
                t = torch.empty(batch_size, response_length, dtype=torch.float32, device=device)
            torch.distributed.broadcast(
                t, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
            )
            return t

        log_probs = gather(lambda o: o[0]["log_probs"] if calculate_entropy else o["log_probs"])
        entropys = gather(lambda o: o[1]) if calculate_entropy else torch.Tensor()
    return log_probs, entropys


def make_minibatch_iterator(self, data: Any) -> Iterable[Any]:
    recompute = self.config.get("recompute_old_log_prob", True)
    if not recompute and self.config.ppo_epochs != 1:
        raise ValueError("recompute_old_log_prob=False needs ppo_epochs=1 (old = current only on the first pass)")
    keys = minibatch_keys(recompute, self.config.use_kl_loss)
    cap = rollout_correction.tis_cap(self.config)
    rollout_correction.require_rollout_log_probs(data.batch.keys(), cap)
    # the per-step rollout/train mismatch (pass skipped) and TIS read the rollout's log-probs
    if (not recompute or cap is not None) and ROLLOUT_LOG_PROBS in data.batch.keys():
        keys.append(ROLLOUT_LOG_PROBS)
    data = data.select(batch_keys=keys)
    return data.make_iterator(
        mini_batch_size=self.config.ppo_mini_batch_size,
        epochs=self.config.ppo_epochs,
        seed=self.config.data_loader_seed,
        dataloader_kwargs={"shuffle": self.config.shuffle},
    )


def forward_backward_batch(
    self,
    data: Any,
    forward_only: bool = False,
    post_process_fn: Callable | None = None,
    calculate_entropy: bool = False,
    use_dynamic_bsz: bool = False,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    mini_batch_size: int | None = None,
) -> dict:
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state as mpu
    from megatron.core.pipeline_parallel import get_forward_backward_func

    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.models.mcore import get_mcore_forward_fn
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty
    from verl.utils.megatron.pipeline_parallel import make_batch_generator
    from verl.utils.megatron.tensor_parallel import vocab_parallel_entropy, vocab_parallel_log_probs_from_logits
    from verl.utils.py_functional import append_to_dict
    from verl.utils.seqlen_balancing import rearrange_micro_batches
    from verl.utils.torch_functional import broadcast_dict_tensor

    temperature = temperature_of(data.meta_info)
    recompute = self.config.get("recompute_old_log_prob", True)
    tis_cap = None if forward_only else rollout_correction.tis_cap(self.config)
    pack_seqs = bool(self.config.get("use_packed_seq", False))
    mini_batch = data
    broadcast_dict_tensor(
        mini_batch.batch, src=mpu.get_pipeline_model_parallel_last_rank(), group=mpu.get_pipeline_model_parallel_group()
    )
    mini_batch.batch["attention_mask"] = mini_batch.batch["attention_mask"].to(bool)

    indices = None
    if use_dynamic_bsz:
        if max_token_len is None:
            max_token_len = dynamic_bsz_token_budget(self.config, forward_only, None)
        micro_batches, indices = rearrange_micro_batches(batch=mini_batch.batch, max_token_len=max_token_len)
        total_seqlen = max_token_len
    else:
        if micro_batch_size is None:
            raise ValueError("micro_batch_size is needed without use_dynamic_bsz")
        micro_batches = mini_batch.batch.split(micro_batch_size)
        total_seqlen = micro_batch_size * micro_batches[0]["input_ids"].shape[1]
    n_micro_batch = len(micro_batches)
    n_sequences = mini_batch.batch.batch_size[0]
    forward_fn = get_mcore_forward_fn(self.hf_config)

    def loss_func(output: dict, data: dict, meta_info: dict) -> tuple[torch.Tensor, list]:
        device = output["log_probs"].device
        metrics: dict = {}
        responses = data["responses"]
        response_length = responses.size(1)
        if forward_only:
            if post_process_fn is not None:
                metrics.update(post_process_fn(output, data))
            entropy = output["entropy"][:, -response_length - 1 : -1].contiguous() if calculate_entropy else None
            return torch.tensor(1.0, device=device), ([metrics, entropy] if calculate_entropy else metrics)

        response_mask = data["attention_mask"][:, -response_length:]
        mode = self.config.loss_agg_mode
        log_prob = output["log_probs"][:, -response_length - 1 : -1].contiguous()
        old_log_prob = data["old_log_probs"] if recompute else log_prob.detach()
        clip_ratio = meta_info["clip_ratio"]
        low = self.config.clip_ratio_low if self.config.clip_ratio_low is not None else clip_ratio
        high = self.config.clip_ratio_high if self.config.clip_ratio_high is not None else clip_ratio
        if tis_cap is not None:
            rollout_correction.require_rollout_log_probs(data.keys(), tis_cap)
        (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower), tis_metrics = rollout_correction.policy_loss(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=data["advantages"],
            response_mask=response_mask,
            cliprange=clip_ratio,
            cliprange_low=low,
            cliprange_high=high,
            clip_ratio_c=meta_info["clip_ratio_c"],
            loss_agg_mode=mode,
            rollout_log_prob=data[ROLLOUT_LOG_PROBS] if tis_cap is not None else None,
            cap=tis_cap,
        )
        metrics.update(tis_metrics)
        policy_loss = pg_loss
        if not recompute and ROLLOUT_LOG_PROBS in data.keys():
            # the driver never holds the training log-probs when the old-log-prob pass is skipped: report the
            # rollout/train mismatch of the sampled tokens from here (both at the sampling temperature)
            from verl_patches.worker_calls.logprob_mismatch import mismatch_metrics

            metrics.update(mismatch_metrics(data[ROLLOUT_LOG_PROBS], log_prob.detach(), response_mask))
        if self.config.use_kl_loss:
            kld = kl_penalty(logprob=log_prob, ref_logprob=data["ref_log_prob"], kl_penalty=self.config.kl_loss_type)
            kl_loss = agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=mode)
            policy_loss = policy_loss + kl_loss * self.config.kl_loss_coef
            metrics["actor/kl_loss"] = kl_loss.detach().item()
            metrics["actor/kl_coef"] = self.config.kl_loss_coef
        if use_dynamic_bsz:
            # Megatron divides every micro-batch loss by the number of micro-batches; with token-budget
            # micro-batches of unequal sizes, weight each by its share of the mini-batch's sequences instead
            policy_loss = policy_loss * (responses.size(0) * n_micro_batch / n_sequences)
        append_to_dict(
            metrics,
            {
                "actor/pg_loss": pg_loss.detach().item(),
                "actor/pg_clipfrac": pg_clipfrac.detach().item(),
                "actor/ppo_kl": ppo_kl.detach().item(),
                "actor/pg_clipfrac_lower": pg_clipfrac_lower.detach().item(),
            },
        )
        return policy_loss, [metrics, None]

    def forward_step(batch_iter: Iterable, model: Any) -> tuple[Any, Callable]:
        batch = next(batch_iter)
        input_ids, attention_mask, position_ids = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        response_length = batch["responses"].size(1)
        label = copy.deepcopy(position_ids)
        label[:, -response_length - 1 : -1] = batch["responses"]
        label_mask = copy.deepcopy(attention_mask)
        label_mask[:, : -response_length - 1] = False
        label_mask[:, -1] = False

        def logits_processor(logits: torch.Tensor, label: torch.Tensor, label_mask: torch.Tensor) -> dict:
            logits = tempered(logits, temperature)
            ret = {}
            if calculate_entropy:
                ret["entropy"] = vocab_parallel_entropy(logits)
            # core's cross entropy subtracts the max from its input in place: hand it its own copy in fp32
            log_probs = vocab_parallel_log_probs_from_logits(logits.clone() if calculate_entropy else logits, label)
            ret["log_probs"] = log_probs.masked_fill(~label_mask, 0.0)
            return ret

        output = forward_fn(
            model,
            input_ids,
            attention_mask,
            position_ids,
            sequence_parallel=self.tf_config.sequence_parallel,
            pack_seqs=pack_seqs,
            logits_processor=logits_processor,
            logits_processor_args={"label": label, "label_mask": label_mask},
        )
        # the reference's config has no PPO clip settings; only the loss reads them
        meta_info = (
            {}
            if forward_only
            else {"clip_ratio": self.config.clip_ratio, "clip_ratio_c": self.config.get("clip_ratio_c", 3.0)}
        )
        return output, partial(loss_func, data=batch, meta_info=meta_info)

    batch_generator = make_batch_generator(micro_batches, vpp_size=len(self.actor_module))
    losses_reduced = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=batch_generator,
        model=self.actor_module,
        num_microbatches=n_micro_batch,
        seq_length=total_seqlen,
        micro_batch_size=1,
        forward_only=forward_only,
    )
    result = {"output": losses_reduced}
    if use_dynamic_bsz:
        result["indices"] = indices
    return result


PROFILED_ITERATION = 1  # the second optimizer step: the first one pays for lazy allocations


def update_policy(self, dataloader: Iterable[Any]) -> dict:
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.py_functional import append_to_dict

    metrics: dict = {}
    for data in dataloader:
        # PROFILE_UPDATE=1 traces one whole step on rank 0 to ./profiling/update_actor (vendor item C9)
        profiler = npu_profiler.NPUProfiler("update_actor") if self.iteration == PROFILED_ITERATION else None
        if profiler is not None:
            profiler.start()
        self.actor_optimizer.zero_grad()
        for chunk in self.actor_module:
            chunk.zero_grad_buffer()
        micro_batch_size = data.meta_info.get("micro_batch_size", None) or self.config.ppo_micro_batch_size_per_gpu
        out = self.forward_backward_batch(
            data,
            calculate_entropy=False,
            use_dynamic_bsz=self.config.use_dynamic_bsz,
            micro_batch_size=micro_batch_size,
            mini_batch_size=self.config.ppo_mini_batch_size,
        )
        for item in out["output"]:
            append_to_dict(metrics, item[0])
        update_successful, grad_norm, _ = self.actor_optimizer.step()
        if profiler is not None:
            profiler.step()
            profiler.stop()
        if not update_successful:
            raise RuntimeError("the optimizer step was skipped (non-finite gradients)")
        self.iteration += 1
        append_to_dict(metrics, {"actor/grad_norm": grad_norm, "actor/lr": self.actor_optimizer.param_groups[-1]["lr"]})
    empty_cache()
    return metrics
