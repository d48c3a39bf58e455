"""G5: ``PackedSeqParams`` with the padded cumulative lengths verl's packed-sequence helpers pass.

verl's ``preprocess_packed_seqs`` constructs ``PackedSeqParams(cu_seqlens_q_padded=..., cu_seqlens_kv_padded=...)``;
core_r0.8.0's dataclass lacks both fields, so the packed path stops with a TypeError before the model runs.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


@dataclass
class PackedSeqParams:
    qkv_format: str = None
    cu_seqlens_q: Tensor = None
    cu_seqlens_kv: Tensor = None
    cu_seqlens_q_padded: Tensor = None
    cu_seqlens_kv_padded: Tensor = None
    max_seqlen_q: Tensor = None
    max_seqlen_kv: Tensor = None
