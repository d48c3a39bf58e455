"""How each HF tensor becomes a Megatron rank's tensor and back (MindSpeed-LLM DeepSeek-V3 layouts).

Read from MindSpeed-LLM v2.0.0 (``examples/mcore/deepseek3/convert_ckpt_deepseek3.py`` and
``..._mcore2hf.py``) and Megatron core 0.8 ``GroupedMLP``; re-implemented here. ``T`` = TP size, ``t`` =
TP rank, ``H`` = hidden size.

* ``replicated``: the same full tensor on every rank (norms, router weight, router ``expert_bias``).
* ``concat_rows`` (``linear_qkv``): ``cat([q_a_proj, kv_a_proj_with_mqa], dim 0)``, replicated on TP
  (shape ``[q_lora_rank + kv_lora_rank + qk_rope_head_dim, H]``).
* ``tp_rows`` (``linear_qb``, ``linear_kvb``, embedding, output layer): rows ``[t*R/T, (t+1)*R/T)``.
* ``tp_cols`` (``linear_proj``, every ``linear_fc2``/down projection): columns ``[t*C/T, (t+1)*C/T)``.
* ``gate_up`` (dense and shared-expert ``linear_fc1``): ``cat([gate[rows_t], up[rows_t]], dim 0)``: each
  TP rank holds its gate slice followed by its up slice (gate/up interleaved per TP chunk), so SwiGLU's
  ``chunk(2, dim=-1)`` works locally.

Grouped-GEMM routed experts (``mlp.experts.weight1`` / ``weight2``), ``E_l`` experts on the rank, ``f`` =
the FFN slice per rank (``moe_intermediate_size / T``, or the whole of it with TP-extend-EP):

* ``weight1`` has shape ``[H, E_l * 2f]`` but its memory is ``[E_l, H, 2f]``: GroupedMLP.forward reads it
  as ``weight1.view(E_l, H, -1)``. Expert ``i``'s block is ``[gate_slice^T | up_slice^T]`` (``[H, f]``
  each). So ``weight1[:, i*2f:(i+1)*2f]`` is **not** expert ``i`` unless ``E_l == 1``; use
  ``weight1.view(E_l, H, 2f)[i]``, whose ``[:, :f].T`` is gate and ``[:, f:].T`` is up.
* ``weight2`` has shape ``[E_l * f, H]`` with memory ``[E_l, f, H]`` (``view(E_l, -1, H)``); expert ``i``'s
  rows ``[i*f, (i+1)*f)`` are ``down_slice^T`` (``down[:, cols_t].T``).

Non-grouped experts (``local_experts.{j}.linear_fc1/fc2``) use ``gate_up`` / ``tp_cols`` per expert.
The forward builders read only the slices they need through a source with ``get/rows/cols/shape/dtype``
(a lazily mapped checkpoint, or ``MetaSource`` for shape-only planning).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch


class TensorSource(Protocol):
    def get(self, name: str) -> torch.Tensor: ...
    def rows(self, name: str, start: int, stop: int) -> torch.Tensor: ...
    def cols(self, name: str, start: int, stop: int) -> torch.Tensor: ...
    def shape(self, name: str) -> tuple[int, ...]: ...
    def dtype(self, name: str) -> torch.dtype: ...


class MetaSource:
    """Shape-only tensors on the ``meta`` device: plans a rank's tensors without reading any weight."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, torch.dtype]):
        self._shapes, self._dtypes = shapes, dtypes

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._shapes[name])

    def dtype(self, name: str) -> torch.dtype:
        return self._dtypes[name]

    def get(self, name: str) -> torch.Tensor:
        return torch.empty(self.shape(name), dtype=self.dtype(name), device="meta")

    def rows(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.get(name)[start:stop]

    def cols(self, name: str, start: int, stop: int) -> torch.Tensor:
        return self.get(name)[:, start:stop]


def chunk_range(n: int, parts: int, idx: int) -> tuple[int, int]:
    size = n // parts
    return idx * size, (idx + 1) * size


# ---------------------------------------------------------------- HF -> Megatron (one rank)


def build_replicated(src: TensorSource, names: Sequence[str]) -> torch.Tensor:
    return src.get(names[0])


def build_concat_rows(src: TensorSource, names: Sequence[str]) -> torch.Tensor:
    return torch.cat([src.get(n) for n in names], dim=0)


def build_tp_rows(src: TensorSource, names: Sequence[str], parts: int, idx: int) -> torch.Tensor:
    a, b = chunk_range(src.shape(names[0])[0], parts, idx)
    return src.rows(names[0], a, b)


def build_tp_cols(src: TensorSource, names: Sequence[str], parts: int, idx: int) -> torch.Tensor:
    a, b = chunk_range(src.shape(names[0])[1], parts, idx)
    return src.cols(names[0], a, b).contiguous()


def build_gate_up(src: TensorSource, names: Sequence[str], parts: int, idx: int) -> torch.Tensor:
    gate, up = names
    a, b = chunk_range(src.shape(gate)[0], parts, idx)
    return torch.cat([src.rows(gate, a, b), src.rows(up, a, b)], dim=0)


def build_grouped_w1(src: TensorSource, gate_up_names: Sequence[tuple[str, str]], parts: int, idx: int) -> torch.Tensor:
    """``[H, E_l*2f]`` with memory ``[E_l, H, 2f]``; ``gate_up_names`` = ((gate_e, up_e) for local experts)."""
    f, h = src.shape(gate_up_names[0][0])
    a, b = chunk_range(f, parts, idx)
    fc = b - a
    first = src.rows(gate_up_names[0][0], a, b)
    out = torch.empty((len(gate_up_names), h, 2 * fc), dtype=first.dtype, device=first.device)
    for i, (gate, up) in enumerate(gate_up_names):
        out[i, :, :fc] = (first if i == 0 else src.rows(gate, a, b)).T
        out[i, :, fc:] = src.rows(up, a, b).T
    return out.view(h, len(gate_up_names) * 2 * fc)


def build_grouped_w2(src: TensorSource, down_names: Sequence[str], parts: int, idx: int) -> torch.Tensor:
    """``[E_l*f, H]`` with memory ``[E_l, f, H]``."""
    h, f = src.shape(down_names[0])
    a, b = chunk_range(f, parts, idx)
    fc = b - a
    first = src.cols(down_names[0], a, b)
    out = torch.empty((len(down_names), fc, h), dtype=first.dtype, device=first.device)
    for i, down in enumerate(down_names):
        out[i] = (first if i == 0 else src.cols(down, a, b)).T
    return out.view(len(down_names) * fc, h)


# ---------------------------------------------------------------- Megatron -> HF (one HF tensor)


def merge_tp_rows(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat(list(parts), dim=0)


def merge_tp_cols(parts: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat(list(parts), dim=1)


def split_concat_rows(t: torch.Tensor, sizes: Sequence[int], pos: int) -> torch.Tensor:
    return torch.split(t, list(sizes), dim=0)[pos]


def merge_gate_up(parts: Sequence[torch.Tensor], pos: int) -> torch.Tensor:
    """Gate (``pos`` 0) or up (1) from each TP rank's ``[gate_t; up_t]``."""
    return torch.cat([p.chunk(2, dim=0)[pos] for p in parts], dim=0)


def expert_from_w1(w1: torch.Tensor, n_local: int, hidden: int, i: int, pos: int) -> torch.Tensor:
    """Gate (``pos`` 0) or up (1) slice ``[f, H]`` of local expert ``i`` from a grouped ``weight1``."""
    block = w1.reshape(n_local, hidden, -1)[i]
    fc = block.shape[1] // 2
    return (block[:, :fc] if pos == 0 else block[:, fc:]).T


def expert_from_w2(w2: torch.Tensor, n_local: int, hidden: int, i: int) -> torch.Tensor:
    """Down slice ``[H, f]`` of local expert ``i`` from a grouped ``weight2``."""
    return w2.reshape(n_local, -1, hidden)[i].T
