"""Patches of verl's Megatron worker and actor for DeepSeek-V3 on core_r0.8.0 + MindSpeed (vendor items C1, C3, C6)."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import CPU_ONLY, replace, wrap

_W = "verl_patches.patches.verl.workers.megatron_workers"
_D2D = "verl_patches.patches.verl.workers.d2d_cache"
_PROGRESS = "verl_patches.patches.verl.workers.progress_points"
_A = "verl_patches.patches.verl.workers.actor.megatron_actor"
_WORKER = "verl.workers.megatron_workers:ActorRolloutRefWorker"
_ACTOR = "verl.workers.actor.megatron_actor:MegatronPPOActor"

PATCHES = (
    [
        wrap(
            name="megatron_worker.init_through_mindspeed",
            target=f"{_WORKER}.__init__",
            fingerprint="sha256:4b5c2fdc77a58284",
            by=f"{_W}:wrap_init",
            vendor_item="C1",
            reason="bring Megatron up through MindSpeed-LLM/MindSpeed (D1) on the device's process group instead of "
            "nccl + initialize_model_parallel(expert_tensor_parallel_size), absent in core_r0.8.0; normalise "
            "the reference's batch sizes for the fused actor_rollout_ref role",
        ),
        replace(
            name="megatron_worker.build_model_optimizer",
            target=f"{_WORKER}._build_model_optimizer",
            fingerprint="sha256:670f4f0123e5b418",
            by=f"{_W}:_build_model_optimizer",
            vendor_item="C1",
            reason="build the actor for every actor role and the reference separately (is_for_actor), and load "
            "use_dist_checkpointing weights from our converter's legacy iter_*/mp_rank_* layout",
        ),
        wrap(
            name="megatron_worker.init_model",
            target=f"{_WORKER}.init_model",
            fingerprint=pinned(f"{_WORKER}.init_model"),
            by=f"{_W}:wrap_init_model",
            calls_original=False,  # our init_model under upstream's registration: the innermost layer
            vendor_item="C1",
            reason="pass is_for_actor to the model builder and take the parameter dtype from the Megatron arguments",
        ),
        wrap(
            name="megatron_worker.update_actor_temperature",
            target=f"{_WORKER}.update_actor",
            fingerprint=pinned(f"{_WORKER}.update_actor"),
            by=f"{_W}:wrap_with_temperature",
            vendor_item="local",
            reason="the actor's loss needs the rollout's sampling temperature on every batch it trains on",
        ),
        # The D2D tensor cache (C1/C2): each wraps the method below it in this list or in workers.declarations
        # (timing), so upstream's body still runs; a call without the driver's D2D flag passes straight through.
        wrap(
            name="megatron_worker.generate_sequences_d2d_cache",
            target=f"{_WORKER}.generate_sequences",
            fingerprint=pinned(f"{_WORKER}.generate_sequences"),
            by=f"{_D2D}:wrap_generate_sequences",
            vendor_item="C1",
            reason="with the D2D tensor cache, keep responses/input_ids/attention_mask/position_ids/rollout_log_probs "
            "on the worker and hand the driver only prompts/responses/attention_mask (not on validation)",
        ),
        wrap(
            name="megatron_worker.compute_ref_log_prob_d2d_cache",
            target=f"{_WORKER}.compute_ref_log_prob",
            fingerprint=pinned(f"{_WORKER}.compute_ref_log_prob"),
            by=f"{_D2D}:wrap_compute_ref_log_prob",
            vendor_item="C1",
            reason="with the D2D tensor cache, take the inputs from the cache resharded to the Megatron DP layout (C2) "
            "and keep ref_log_prob there; the driver gets a batch of the right size with no tensor",
        ),
        wrap(
            name="megatron_worker.update_actor_d2d_cache",
            target=f"{_WORKER}.update_actor",
            fingerprint=pinned(f"{_WORKER}.update_actor"),
            by=f"{_D2D}:wrap_update_actor",
            vendor_item="C1",
            reason="with the D2D tensor cache, add the cached tensors to the driver's advantages, clear the cache "
            "after the update (also when it fails)",
        ),
    ]
    # The outermost layer of each method's stack (declared after the temperature, D2D and timing wraps and,
    # through the catalog order, after the checkpoint save's new body): the call's phase is entered before the
    # D2D wraps mark their reshard phase inside it and left after, so a rank stuck in a D2D reshard is reported
    # in its call and step; beneath the D2D wrap those marks would land outside any call.
    + [
        wrap(
            name=f"megatron_worker.{method}_progress",
            target=f"{_WORKER}.{method}",
            fingerprint=pinned(f"{_WORKER}.{method}"),
            by=f"{_PROGRESS}:{method}_progress",
            vendor_item="local",
            reason="hang diagnosis: the call is a phase of the trainer step (meta_info['global_steps'], written by our "
            "fit loop) in this process's progress, which its heartbeat publishes; a stuck rank is named "
            "with its phase and step",
        )
        for method in (
            "generate_sequences",
            "compute_ref_log_prob",
            "compute_log_prob",
            "update_actor",
            "init_model",
            "save_checkpoint",
            "load_checkpoint",
        )
    ]
    + [
        wrap(
            name="megatron.make_batch_generator_micro_batch_progress",
            target="verl.utils.megatron.pipeline_parallel:make_batch_generator",
            fingerprint="sha256:812b0cfbc2c26237",
            by=f"{_PROGRESS}:with_micro_batch_progress",
            vendor_item="local",
            reason="hang diagnosis: each micro-batch Megatron's schedule takes is a progress point (ref, old "
            "log-prob and update), so a stuck rank is named with its micro-batch; once per micro-batch, "
            "outside any compiled region",
        ),
        replace(
            name="cpu.megatron_worker.torch_cuda_is_cpu",
            target="verl.workers.megatron_workers:torch",
            fingerprint=pinned(f"{_WORKER}.update_actor"),
            fingerprint_of=(f"{_WORKER}.update_actor",),
            built_by="verl_patches.patches.verl.utils.device:torch_for_fsdp_utils",
            vendor_item="local",
            reason="verl's Megatron worker calls torch.cuda.current_device()/empty_cache() directly; on CPU they get "
            "the CPU device module",
            devices=CPU_ONLY,
            rebind=False,
        ),
        wrap(
            name="megatron_actor.init",
            target=f"{_ACTOR}.__init__",
            fingerprint="sha256:71244399387e17aa",
            by=f"{_A}:wrap_init",
            vendor_item="C3",
            reason="refuse packed sequences and a non-zero entropy coefficient up front; count optimizer steps",
        ),
        replace(
            name="megatron_actor.compute_log_prob",
            target=f"{_ACTOR}.compute_log_prob",
            fingerprint="sha256:87ff9bb61611fd1c",
            by=f"{_A}:compute_log_prob",
            vendor_item="C3",
            reason="honour recompute_old_log_prob (upstream leaves log_probs unbound when it is False); "
            "tempered log-probs",
        ),
        replace(
            name="megatron_actor.make_minibatch_iterator",
            target=f"{_ACTOR}.make_minibatch_iterator",
            fingerprint="sha256:68a2dd59135d8534",
            by=f"{_A}:make_minibatch_iterator",
            vendor_item="C3",
            reason="select old_log_probs only when they were recomputed, ref_log_prob only with the KL loss, "
            "rollout_log_probs for the mismatch metrics and TIS (refused by key when TIS is on without them)",
        ),
        replace(
            name="megatron_actor.forward_backward_batch",
            target=f"{_ACTOR}.forward_backward_batch",
            fingerprint="sha256:80e074cf64a39172",
            by=f"{_A}:forward_backward_batch",
            vendor_item="C3",
            reason="logits divided by the sampling temperature as the rollout samples (upstream never does); "
            "old = current.detach() without recompute; non-packed forward; max_packing_token_size; truncated "
            "importance sampling against the rollout's log-probs with actor.rollout_correction.tis_cap",
        ),
        replace(
            name="megatron_actor.update_policy",
            target=f"{_ACTOR}.update_policy",
            fingerprint="sha256:852adec64a57bdf1",
            by=f"{_A}:update_policy",
            vendor_item="C3",
            reason="count optimizer steps, profile one with PROFILE_UPDATE=1 (C9), empty the device cache after (C8); "
            "a skipped step is an error naming the cause",
        ),
        replace(
            name="megatron_actor.vocab_parallel_entropy_eager",
            target="verl.utils.megatron.tensor_parallel:_VocabParallelEntropy",
            fingerprint="sha256:630da888336bf6d4",
            by="verl_patches.patches.verl.workers.actor.entropy:VocabParallelEntropy",
            vendor_item="C6",
            reason="@torch.compile does not compile on NPU, and MindSpeed swaps torch.compile for jit.script",
        ),
    ]
)
