"""megatron.core (core_r0.8.0) and MindSpeed's replacement of the same functions: train-engine items D3, D4.

The CPU port of Megatron itself is the emulated torch_npu.contrib.transfer_to_npu (cuda calls ->
the emulated npu -> the CPU), exactly the mechanism MindSpeed relies on for A3; see
verl_patches.npu_emulation.transfer.
"""

from verl_patches.patching.declaration import Patch, replace, wrap

PATCHES: list[Patch] = [
    wrap(
        name="megatron.transformer_block.uneven_num_layers_to_build",
        target="megatron.core.transformer.transformer_block:get_num_layers_to_build",
        fingerprint="sha256:9d98a4aed3400414",
        by="verl_patches.patches.megatron.pipeline_layers:uneven_num_layers_to_build",
        vendor_item="D4",
        reason="pipeline_parallel_num_layer_list (61 layers over 8 stages as 7,7,8,8,8,8,8,7): core_r0.8.0 builds "
        "num_layers // pp per stage (56 of 61)",
    ),
    wrap(
        name="megatron.transformer_layer.uneven_layer_offset",
        target="megatron.core.transformer.transformer_layer:TransformerLayer._get_layer_offset",
        fingerprint="sha256:a8329e90332cacf0",
        by="verl_patches.patches.megatron.pipeline_layers:uneven_layer_offset",
        vendor_item="D4",
        reason="layer numbers (which decide dense vs MoE via first_k_dense_replace) must follow the uneven split",
    ),
    replace(
        name="megatron.p2p.communicate_shapes_once",
        target="megatron.core.pipeline_parallel.p2p_communication:_communicate_shapes",
        fingerprint="sha256:9816b8fcb665e174",
        by="verl_patches.patches.megatron.p2p_shapes:communicate_shapes",
        vendor_item="D3",
        reason="variable sequence lengths: core_r0.8.0 always batches the shape exchange and synchronizes the device "
        "(slow or hanging on HCCL)",
    ),
    replace(
        name="mindspeed.p2p.communicate_shapes_once",
        target="mindspeed.core.pipeline_parallel.p2p_communication:_communicate_shapes",
        fingerprint="sha256:b094a71f4b7780dc",
        by="verl_patches.patches.megatron.p2p_shapes:communicate_shapes",
        vendor_item="D3",
        reason="MindSpeed installs this over Megatron's with variable_seq_lengths; it runs the ring exchange twice",
    ),
]
