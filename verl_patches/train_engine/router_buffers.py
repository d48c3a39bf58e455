"""MindSpeed-LLM's DeepSeek-V3 router buffers stay float32 in a bf16 model.

MindSpeed-LLM registers the router's score-correction bias (``expert_bias``, in the checkpoint and synced to
the rollout) and its token counter (``local_tokens_per_expert``) as float32 buffers. Megatron core_r0.8.0's
``Float16Module`` casts the whole module with ``.bfloat16()``, buffers included, so in a bf16 job
(every A3 profile) the bias was rounded when loaded, the counter stopped counting exactly past 256 tokens,
and the weight sync refused the model (its plan carries the bias as float32, as the converter writes it).
Called on the model chunks right after ``get_model`` and before any weights are loaded, so the checkpoint's
float32 values land unrounded.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT32_ROUTER_BUFFERS = ("expert_bias", "local_tokens_per_expert")


def keep_router_buffers_float32(chunks: Iterable[torch.nn.Module]) -> list[str]:
    """Cast the router buffers above back to float32 in place; returns the names cast (none in fp32 runs)."""
    cast: list[str] = []
    for i, chunk in enumerate(chunks):
        for name, mod in chunk.named_modules():
            for buf in FLOAT32_ROUTER_BUFFERS:
                t = mod._buffers.get(buf)
                if t is not None and t.is_floating_point() and t.dtype != torch.float32:
                    mod._buffers[buf] = t.to(torch.float32)
                    cast.append(f"chunk{i}:{name}.{buf}" if name else f"chunk{i}:{buf}")
    return cast
