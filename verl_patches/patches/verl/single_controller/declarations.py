"""Patches of verl.single_controller.*."""

from verl_patches.patching.declaration import Kind, Patch, lazy_call


PATCHES = [
    Patch(
        name="cpu.verl.ray_worker_group.logical_gpu_slots",
        target="verl.single_controller.ray.base:RayWorkerGroup.__init__",
        kind=Kind.WRAP,
        fingerprint="sha256:78dad8337e9b5b52",
        fingerprint_of=("verl.single_controller.ray.base:RayWorkerGroup.__init__",
                        "verl.single_controller.ray.base:RayResourcePool.get_placement_groups",
                        "verl.single_controller.ray.base:RayClassWithInitArgs.__call__"),
        replacement=lazy_call("verl_patches.patches.verl.single_controller.ray_base:ray_device_for_cpu"),
        vendor_item="local",
        reason="verl asks Ray for a 'cpu' resource on CPU hosts, which no cluster offers; use the logical GPU slots",
        devices=("cpu",),
    ),
]
