"""Patches of verl.trainer.*."""

from verl_patches.patching.declaration import ALL_DEVICES, Kind, Patch, lazy_call


PATCHES = [
    Patch(
        name="metrics.reference_step_table",
        target="verl.trainer.ppo.metric_utils:compute_throughout_metrics",
        kind=Kind.WRAP,
        fingerprint="sha256:60a463364a4e1d69",
        replacement=lazy_call("verl_patches.patches.verl.trainer.metrics:with_reference_metrics"),
        vendor_item="local",
        reason="per-die and per-card throughput and the weight-switch time, named like the vendor's step table",
        devices=ALL_DEVICES,
    ),
    Patch(
        name="verl.main_ppo.ray_runtime_env",
        target="verl.trainer.main_ppo:run_ppo",
        kind=Kind.WRAP,
        fingerprint="sha256:d0ed4d56bc42d804",
        replacement=lazy_call("verl_patches.patches.verl.trainer.main_ppo:start_ray_with_overlay"),
        vendor_item="A1",
        reason="every Ray worker must run our prelude (worker_process_setup_hook) and see the repo root; "
        "on CPU, Ray offers logical GPU slots for verl's resource pools",
        devices=ALL_DEVICES,
    ),
    Patch(
        name="trainer.fused_actor_rollout_ref",
        target="verl.trainer.ppo.ray_trainer:RayPPOTrainer.init_workers",
        kind=Kind.WRAP,
        fingerprint="sha256:75e2048defa69674",
        replacement=lazy_call("verl_patches.trainer.fused_role:with_fused_role"),
        vendor_item="A1",
        reason="with overlay.fused_actor_rollout_ref=True one actor_rollout_ref worker group plays actor, rollout "
        "and reference on one pool (ref_policy_wg is actor_rollout_wg); otherwise upstream's init",
        devices=ALL_DEVICES,
    ),
    Patch(
        name="trainer.fit_step_plan",
        target="verl.trainer.ppo.ray_trainer:RayPPOTrainer.fit",
        kind=Kind.WRAP,
        fingerprint="sha256:8473f7a548dfc9a8",
        replacement=lazy_call("verl_patches.trainer.fit_loop:with_overlay_fit"),
        vendor_item="A2",
        reason="skip the old-log-prob pass when recompute_old_log_prob=False (exact on-policy only), ship only "
        "what the D2D tensor cache (overlay.d2d_tensor_cache, D2D_DATA_TRANSFER overrides) leaves to the "
        "driver, give every worker call the step (for hang diagnosis), log the rollout/train "
        "log-prob mismatch every step and the worker classes that ran; REMAX keeps upstream's fit",
        devices=ALL_DEVICES,
    ),
]
