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
]
