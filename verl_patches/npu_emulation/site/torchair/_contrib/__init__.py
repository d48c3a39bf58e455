"""torchair._contrib on a CPU host (vllm-ascend imports custom_torch_ops for its graph-mode op registrations)."""
