"""Patches of verl.single_controller.*."""

from verl_patches.patching.declaration import CPU_ONLY, replace, wrap

PATCHES = [
    wrap(
        name="cpu.verl.ray_worker_group.logical_gpu_slots",
        target="verl.single_controller.ray.base:RayWorkerGroup.__init__",
        fingerprint="sha256:78dad8337e9b5b52",
        fingerprint_of=(
            "verl.single_controller.ray.base:RayWorkerGroup.__init__",
            "verl.single_controller.ray.base:RayResourcePool.get_placement_groups",
            "verl.single_controller.ray.base:RayClassWithInitArgs.__call__",
        ),
        by="verl_patches.patches.verl.single_controller.ray_base:ray_device_for_cpu",
        vendor_item="local",
        reason="verl asks Ray for a 'cpu' resource on CPU hosts, which no cluster offers; use the logical GPU slots",
        devices=CPU_ONLY,
    ),
]

PATCHES.append(
    wrap(
        name="verl.dispatch.megatron_dp_rank_map",
        target="verl.single_controller.base.decorator:get_predefined_dispatch_fn",
        fingerprint="sha256:acb2891f52de8bb0",
        fingerprint_of=(
            "verl.single_controller.base.decorator:get_predefined_dispatch_fn",
            "verl.single_controller.base.decorator:dispatch_megatron_compute_data_proto",
        ),
        by="verl_patches.patches.verl.single_controller.dispatch:with_dp_rank_map",
        vendor_item="B1",
        reason="MEGATRON_COMPUTE_PROTO writes meta_info['global_megatron_dp_ranks'] so workers can reshard "
        "batch data between rollout chunks and Megatron DP slices on the device (C2)",
    )
)

# Hang diagnosis (verl_patches.resilience): the driver's wait on a worker group is bounded, and every worker
# process publishes its progress.
PATCHES += [
    replace(
        name="resilience.verl.func_generator.bounded_wait",
        target="verl.single_controller.ray.base:func_generator",
        fingerprint="sha256:745d404315575cf8",
        by="verl_patches.resilience.worker_deadline:func_generator",
        vendor_item="local",
        reason="the driver never waits for a worker group without a bound: a call whose outstanding workers make "
        "no progress for VERL_PATCHES_COLLECTIVE_TIMEOUT_S names them (rank, node, pid, phase, step) and "
        "ends the job; a dead worker is named at once; upstream's ray.get while that variable is unset",
    ),
    wrap(
        name="resilience.verl.worker.heartbeat",
        target="verl.single_controller.base.worker:Worker.__init__",
        fingerprint="sha256:00c6bf5f1cbcd9ae",
        by="verl_patches.patches.verl.workers.progress_points:start_heartbeat",
        vendor_item="local",
        reason="every worker process publishes its progress (rank, node, pid, phase, step, micro-batch) from a "
        "side thread that runs while its main thread is blocked; not started while "
        "VERL_PATCHES_COLLECTIVE_TIMEOUT_S is unset",
    ),
]
