"""G11: verl's GPT forward for DeepSeek-V3 on MindSpeed-LLM (non-packed, NPU flash-attention mask).

Upstream's non-packed branch refuses a ``logits_processor`` (so the actor, which always passes one, can only
run packed) and hands the model a ``[B, S]`` 0/1 mask. Here the non-packed branch is the default: left
padding is removed, the mask becomes the ``[B, 1, S, S]`` boolean mask ``npu_fusion_attention`` takes
(True = masked: the causal upper triangle, and every row or column that is padding), the logits are put
back at the original positions, and the ``logits_processor`` runs on them. Packed sequences are refused
with a clear error: MindSpeed-LLM's MLA takes no ``packed_seq_params`` on this stack.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class PackedSequencesUnsupported(NotImplementedError):
    """``use_packed_seq=True`` with DeepSeek-V3 on core_r0.8.0 + MindSpeed-LLM."""


def npu_fa_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, S]`` (1/True = token) -> ``[B, 1, S, S]`` bool, True where query i must not see key j."""
    valid = attention_mask.bool()
    s = valid.shape[1]
    future = torch.ones(s, s, dtype=torch.bool, device=valid.device).triu(1)
    pad = ~(valid[:, :, None] & valid[:, None, :])
    return (future[None] | pad)[:, None]


def gptmodel_forward(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    sequence_parallel: bool,
    value_model: bool = False,
    pack_seqs: bool = False,
    logits_processor: Callable[..., dict] | None = None,
    logits_processor_args: dict | None = None,
) -> Any:
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.models.mcore.util import recover_left_padding, remove_left_padding
    from verl.utils.megatron_utils import unwrap_model

    if pack_seqs:
        raise PackedSequencesUnsupported(
            "actor_rollout_ref.actor.use_packed_seq=True: packed sequences are not supported for DeepSeek-V3 on "
            "core_r0.8.0 + MindSpeed-LLM (its MLA takes no packed_seq_params); set it to False"
        )
    inner = unwrap_model(model)
    pre_process, post_process = inner.pre_process, inner.post_process
    seq_len = attention_mask.shape[1]
    new_ids, new_mask, new_pos = remove_left_padding(
        input_ids, attention_mask, position_ids, sequence_parallel, pre_process=pre_process
    )
    output = model(input_ids=new_ids, attention_mask=npu_fa_mask(new_mask), position_ids=new_pos)
    output = recover_left_padding(output, new_mask.bool(), attention_mask.bool(), seq_len, post_process=post_process)
    if value_model and post_process:
        output = output[..., 0]
    if post_process and logits_processor is not None:
        output = logits_processor(output, **(logits_processor_args or {}))
    return output
