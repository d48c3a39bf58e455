"""torch_npu.contrib on the CPU: `transfer_to_npu` is the only member MindSpeed imports."""
