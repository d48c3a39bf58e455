"""torch_npu.npu_prefetch: an L2-cache prefetch hint the NPU overlaps with compute (vllm-ascend issues it for
o_proj / q_a_proj weights under enable_multistream_mla). A host has no such cache: nothing to do (max_size and
offset are checked as documented before it runs: wheel_contract/limits.py)."""

from __future__ import annotations

import torch


def npu_prefetch(self: torch.Tensor, dependency: torch.Tensor | None, max_size: int, offset: int = 0) -> None:
    """No effect on any value."""
