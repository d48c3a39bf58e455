"""ATB extension registration (vllm-ascend worker_v1 calls it at start-up); no ATB kernels on a CPU host."""
