"""Pure-torch `flash_attn.bert_padding`: the padding helpers verl imports, with flash-attn 2.7's API.

verl's critic and FSDP/Megatron workers import these unconditionally; flash-attn itself is a CUDA-only
package. Same names, signatures and return arity as flash-attn 2.7 (`unpad_input` returns five values,
the last being the used sequence lengths). Plain indexing keeps autograd working without custom
Functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange, repeat  # flash-attn's module exposes these; verl imports rearrange from it

__all__ = [
    "index_first_axis",
    "index_put_first_axis",
    "unpad_input",
    "pad_input",
    "unpad_input_for_concatenated_sequences",
    "rearrange",
    "repeat",
]


def index_first_axis(input: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Rows `indices` of `input` along its first axis: shape (len(indices), *input.shape[1:])."""
    return input.index_select(0, indices)


def index_put_first_axis(values: torch.Tensor, indices: torch.Tensor, first_axis_dim: int) -> torch.Tensor:
    """A zero tensor of `first_axis_dim` rows with `values` placed at rows `indices`."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_copy(0, indices, values)


def _flatten_batch(hidden_states: torch.Tensor) -> torch.Tensor:
    return hidden_states.reshape(hidden_states.shape[0] * hidden_states.shape[1], *hidden_states.shape[2:])


def _cu_seqlens(seqlens: torch.Tensor) -> torch.Tensor:
    return F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))


def unpad_input(hidden_states: torch.Tensor, attention_mask: torch.Tensor, unused_mask: torch.Tensor | None = None):
    """Drop padding tokens.

    hidden_states (batch, seqlen, ...); attention_mask (batch, seqlen), nonzero = valid; unused_mask
    (batch, seqlen), nonzero = allocated but unused (kept in the output, not counted as used).
    Returns (tokens (total, ...), indices into batch*seqlen, cu_seqlens int32 (batch+1,),
    max_seqlen_in_batch int, used_seqlens_in_batch int32 (batch,)).
    """
    keep = attention_mask.bool() if unused_mask is None else (attention_mask.bool() | unused_mask.bool())
    seqlens = keep.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.bool().sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(keep.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    return index_first_axis(_flatten_batch(hidden_states), indices), indices, _cu_seqlens(seqlens), max_seqlen, used


def pad_input(hidden_states: torch.Tensor, indices: torch.Tensor, batch: int, seqlen: int) -> torch.Tensor:
    """Inverse of unpad_input: (total, ...) tokens back to (batch, seqlen, ...) with zeros at padding."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])


def unpad_input_for_concatenated_sequences(hidden_states: torch.Tensor, attention_mask_in_length: torch.Tensor):
    """Unpad rows that each hold several packed sequences.

    attention_mask_in_length (batch, seqlen): row i lists the lengths of the sequences packed into row i,
    then zeros, e.g. [2, 3, 0, 0] for a length-2 and a length-3 sequence at the start of a 4+ row.
    Returns (tokens, indices, cu_seqlens over every packed sequence, max_seqlen_in_batch).
    """
    lengths = attention_mask_in_length
    batch, seqlen = lengths.shape
    row_tokens = lengths.sum(dim=-1)
    valid = torch.arange(seqlen, device=lengths.device).expand(batch, seqlen) < row_tokens.unsqueeze(1)
    seqlens = lengths.flatten()
    seqlens = seqlens[seqlens != 0].to(torch.int32)
    indices = torch.nonzero(valid.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    return index_first_axis(_flatten_batch(hidden_states), indices), indices, _cu_seqlens(seqlens), max_seqlen
