"""torch_npu.op_plugin on a CPU host: only the names vllm-ascend imports."""
