"""Patches of verl.trainer.*."""

from verl_patches.patches.upstream_fingerprints import pinned
from verl_patches.patching.declaration import ALL_DEVICES, wrap

_RT = "verl.trainer.ppo.ray_trainer"
_TRAINER = f"{_RT}:RayPPOTrainer"
_DATA = "verl.protocol:DataProto"
_ASYNC = "verl.workers.rollout.async_server:AsyncLLMServerManager"

# Every upstream function, method and class verl_patches.driver.fit_loop calls by name in place of upstream's
# `fit` (through `ray_trainer`'s module names, on the trainer, on the batch, or imported), each pinned on its
# own: a change to any of them changes what our loop does, and the patch then fails naming it. The trainer's
# __init__ and init_workers set the attributes the loop reads (use_rm, ref_in_actor, kl_ctrl_in_reward,
# async_rollout_mode, the worker groups). Not listed: the worker-group calls (generate_sequences,
# compute_log_prob, update_actor, ...), which are the same calls upstream's pinned `fit` makes, to the worker
# methods the megatron_declarations pin.
FIT_LOOP_RELIES_ON = (
    (f"{_RT}:_timer", "sha256:4e5f83986711d4d8"),
    (f"{_RT}:compute_response_mask", "sha256:99e8d60426eb1581"),
    (f"{_RT}:apply_kl_penalty", "sha256:4b26b83a281c7130"),
    (f"{_RT}:compute_advantage", "sha256:6657b62333e50ace"),
    (f"{_RT}:ResourcePoolManager.get_n_gpus", "sha256:3b1abe13ff977faa"),
    (f"{_TRAINER}.__init__", "sha256:47505c3c3b337118"),
    (f"{_TRAINER}.init_workers", pinned(f"{_TRAINER}.init_workers")),
    (f"{_TRAINER}._balance_batch", "sha256:351b36cb62af6d0f"),
    (f"{_TRAINER}._dump_generations", "sha256:d9d403dd67068757"),
    (f"{_TRAINER}._validate", "sha256:167898fc7fa5ad54"),
    (f"{_TRAINER}._save_checkpoint", pinned(f"{_TRAINER}._save_checkpoint")),
    (f"{_TRAINER}._load_checkpoint", pinned(f"{_TRAINER}._load_checkpoint")),
    ("verl.trainer.ppo.core_algos:agg_loss", "sha256:d8157cd94798b00c"),
    ("verl.trainer.ppo.reward:compute_reward", "sha256:d6bced5e88d730b8"),
    ("verl.trainer.ppo.reward:compute_reward_async", "sha256:85065136faf837a4"),
    ("verl.utils.metric.utils:reduce_metrics", "sha256:6b79cea81b77e988"),
    ("verl.trainer.ppo.metric_utils:compute_data_metrics", "sha256:3075aa15e7b2114d"),
    ("verl.trainer.ppo.metric_utils:compute_timing_metrics", "sha256:6e179ab4dc3a8aa9"),
    (
        "verl.trainer.ppo.metric_utils:compute_throughout_metrics",
        pinned("verl.trainer.ppo.metric_utils:compute_throughout_metrics"),
    ),
    ("verl.utils.tracking:Tracking", "sha256:8a56615cc3760d43"),
    (f"{_DATA}.from_single_dict", "sha256:f001836b060eff16"),
    (f"{_DATA}.pop", "sha256:4b795c6d5726f281"),
    (f"{_DATA}.repeat", "sha256:0040f687753a9d53"),
    (f"{_DATA}.union", "sha256:63295e59601b2638"),
    (f"{_ASYNC}.wake_up", "sha256:aefbbd12ce024cbc"),
    (f"{_ASYNC}.generate_sequences", "sha256:950db0e232129de4"),
    (f"{_ASYNC}.sleep", "sha256:fc94e0f4f19febbf"),
)

PATCHES = [
    wrap(
        name="metrics.reference_step_table",
        target="verl.trainer.ppo.metric_utils:compute_throughout_metrics",
        fingerprint=pinned("verl.trainer.ppo.metric_utils:compute_throughout_metrics"),
        by="verl_patches.patches.verl.trainer.metrics:with_reference_metrics",
        vendor_item="local",
        reason="per-die and per-card throughput and the weight-switch time, named like the vendor's step table",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="verl.main_ppo.ray_runtime_env",
        target="verl.trainer.main_ppo:run_ppo",
        fingerprint="sha256:d0ed4d56bc42d804",
        by="verl_patches.patches.verl.trainer.main_ppo:start_ray_with_overlay",
        vendor_item="A1",
        reason="every Ray worker must run our prelude (worker_process_setup_hook) and see the repo root; "
        "on CPU, Ray offers logical GPU slots for verl's resource pools",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="trainer.fused_actor_rollout_ref",
        target=f"{_TRAINER}.init_workers",
        fingerprint=pinned(f"{_TRAINER}.init_workers"),
        by="verl_patches.patches.verl.trainer.ray_trainer:with_fused_role",
        vendor_item="A1",
        reason="with overlay.fused_actor_rollout_ref=True one actor_rollout_ref worker group plays actor, rollout "
        "and reference on one pool (ref_policy_wg is actor_rollout_wg); otherwise upstream's init",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="trainer.fit_step_plan",
        target=f"{_TRAINER}.fit",
        fingerprint="sha256:8473f7a548dfc9a8",
        by="verl_patches.patches.verl.trainer.ray_trainer:with_overlay_fit",
        relies_on=FIT_LOOP_RELIES_ON,
        vendor_item="A2",
        reason="skip the old-log-prob pass when recompute_old_log_prob=False (exact on-policy only), ship only "
        "what the D2D tensor cache (overlay.d2d_tensor_cache, D2D_DATA_TRANSFER overrides) leaves to the "
        "driver, give every worker call the step (for hang diagnosis), log the rollout/train "
        "log-prob mismatch every step and the worker classes that ran; REMAX keeps upstream's fit",
        devices=ALL_DEVICES,
    ),
    wrap(
        name="trainer.val_subset",
        target=f"{_TRAINER}._create_dataloader",
        fingerprint="sha256:98065be136929795",
        by="verl_patches.patches.verl.trainer.val_subset:with_val_subset",
        vendor_item="local",
        reason="validate on a fixed seeded sample of at most overlay.val_max_prompts test prompts (verl has no such "
        "key), so a validation on A3 is one batch of the rollout engines; unset or a smaller split: upstream's",
        devices=ALL_DEVICES,
    ),
]
