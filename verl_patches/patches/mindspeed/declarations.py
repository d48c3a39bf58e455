"""MindSpeed / MindSpeed-LLM on a CPU host (over the torch_npu emulation) and MindSpeed fixes."""

from verl_patches.patching.declaration import CPU_ONLY, module_alias, replace, wrap

PATCHES = [
    module_alias(
        name="cpu.apex.optimizers.module",
        target="apex.optimizers",
        provides="verl_patches.patches.apex.optimizers",
        vendor_item="G2",
        reason="no apex on a CPU host; MindSpeed-LLM and Megatron import FusedAdam and FusedSGD from it "
        "(FusedAdam is MindSpeed's AdamW over the emulated npu_apply_adam_w, as on A3)",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.mindspeed.op_builder.load_emulated_ops",
        target="mindspeed.op_builder.builder:MindSpeedOpBuilder.load",
        fingerprint="sha256:10caa6b2cd642bb4",
        by="verl_patches.patches.mindspeed.op_builder:emulated_load",
        vendor_item="local",
        reason="MindSpeed JIT-compiles its fused ops against CANN/ATB; on a CPU host each builder hands out the "
        "plain-torch emulation (verl_patches.npu_emulation.builder_ops), unknown builders fail by name",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.mindspeed.ops.gmm.dispatch_on_host",
        target="mindspeed.ops.gmm:_npu_gmm_common",
        fingerprint="sha256:02266b729f651ab8",
        by="verl_patches.patches.mindspeed.op_builder:gmm_common_on_host",
        vendor_item="local",
        reason="MindSpeed registers torch.ops.mindspeed.npu_gmm for the NPU dispatch key only; CPU tensors call "
        "the same Python implementation (GMMFunction) directly",
        devices=CPU_ONLY,
    ),
    replace(
        name="cpu.mindspeed.atb_op_builder.load_emulated_ops",
        target="mindspeed.op_builder.atb_builder:AtbOpBuilder.load",
        fingerprint="sha256:8d636f3b97f12108",
        by="verl_patches.patches.mindspeed.op_builder:emulated_load",
        vendor_item="local",
        reason="ATB builders (GroupMatmulAdd, MatmulAdd: fp32 main_grad accumulation) need the CANN NNAL package; "
        "on a CPU host they hand out the plain-torch emulation",
        devices=CPU_ONLY,
    ),
    wrap(
        name="mindspeed.moe.async_all_to_all_waitable_handle",
        target="mindspeed.core.transformer.moe.comm_utils:async_all_to_all",
        fingerprint="sha256:6dc40f0c687a7855",
        by="verl_patches.patches.mindspeed.comm_utils:waitable_single_rank_all_to_all",
        vendor_item="local",
        reason="MindSpeed bug, not an NPU one: with a one-rank expert group async_all_to_all returns handle=None and "
        "the all-to-all overlap backward calls .wait() on it (moe_layer_overlap_all2all.py:574)",
    ),
]
