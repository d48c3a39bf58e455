"""MindSpeed / MindSpeed-LLM on a CPU host (over the torch_npu emulation) and MindSpeed fixes."""

from verl_patches.patching.declaration import Kind, Patch

PATCHES = [
    Patch(
        name="cpu.apex.optimizers.module",
        target="apex.optimizers",
        kind=Kind.MODULE_ALIAS,
        fingerprint="",
        provides="verl_patches.patches.apex.optimizers",
        vendor_item="G2",
        reason="no apex on a CPU host; MindSpeed-LLM and Megatron import FusedAdam and FusedSGD from it "
               "(FusedAdam is MindSpeed's AdamW over the emulated npu_apply_adam_w, as on A3)",
        devices=("cpu",),
    ),
]
