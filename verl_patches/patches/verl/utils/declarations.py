"""Patches of verl.utils.*."""

from verl_patches.patching.declaration import CPU_ONLY, replace

PATCHES = [
    replace(
        name="cpu.verl.utils.device.get_torch_device",
        target="verl.utils.device:get_torch_device",
        fingerprint="sha256:66ca2b0ba76001d2",
        by="verl_patches.patches.verl.utils.device:get_torch_device",
        vendor_item="local",
        reason="torch.cpu lacks the memory, RNG and device calls verl makes on its device module",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.verl.utils.fsdp_utils.torch_cuda_is_cpu",
        target="verl.utils.fsdp_utils:torch",
        fingerprint="sha256:aeeef948f42513d2",
        fingerprint_of=(
            "verl.utils.fsdp_utils:load_fsdp2_model_to_gpu",
            "verl.utils.fsdp_utils:fsdp2_load_full_state_dict",
            "verl.utils.fsdp_utils:fsdp2_clip_grad_norm_",
            "verl.utils.fsdp_utils:layered_summon_lora_params",
        ),
        built_by="verl_patches.patches.verl.utils.device:torch_for_fsdp_utils",
        vendor_item="local",
        reason="verl's FSDP2 helpers call torch.cuda.current_device()/empty_cache() directly; "
        "on CPU they get the CPU device module",
        devices=CPU_ONLY,
        rebind=False,  # only this module's name `torch` changes; every other module keeps the real torch
    ),
]
