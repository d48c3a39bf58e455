"""torch_npu.npu_prefetch: an L2-cache prefetch hint the NPU overlaps with compute (vllm-ascend issues it for
o_proj / q_a_proj weights under enable_multistream_mla). A host has no such cache: nothing to do but check
the arguments the graph-mode converter checks."""

from __future__ import annotations

import torch


def npu_prefetch(self: torch.Tensor, dependency: torch.Tensor | None, max_size: int, offset: int = 0) -> None:
    """No effect on any value; max_size must be positive and offset non-negative."""
    if max_size <= 0:
        raise ValueError(f"npu_prefetch: max_size must be greater than zero, got {max_size}")
    if offset < 0:
        raise ValueError(f"npu_prefetch: offset must be non-negative, got {offset}")
