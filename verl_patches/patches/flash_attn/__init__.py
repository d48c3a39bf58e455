"""Stand-ins for flash-attn, which has no NPU (or CPU) build."""
