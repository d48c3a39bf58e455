"""KV cache of the stand-in: real per-layer tensors sized by vLLM's own KV cache config, written by the
HF attention through a DynamicCache whose `update` stores into them.

Layout per attention layer: one tensor of `num_blocks * block_size` token rows, each row
`[num_heads, qk_head_dim + v_head_dim]` (K and V side by side). This is exactly the page size vLLM's
`FullAttentionSpec(use_mla=True, num_kv_heads=H, head_size=qk+v)` computes, so `get_kv_cache_config`
sizes it. A running sequence in batch slot s owns the contiguous token rows
`[s * slot_tokens, (s + 1) * slot_tokens)` (slot_tokens = whole blocks covering max_model_len).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache


def layer_names(num_layers: int) -> list[str]:
    return [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]


def attention_spec(hf_config: Any, block_size: int, dtype: torch.dtype) -> Any:
    # deferred: importing this module must not load vLLM; it loads once the prelude patched it
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    head = hf_config.qk_nope_head_dim + hf_config.qk_rope_head_dim + hf_config.v_head_dim
    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=hf_config.num_attention_heads, head_size=head, dtype=dtype, use_mla=True
    )


def allocate(kv_cache_config: Any, hf_config: Any, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """One tensor per layer, as vLLM's model runner allocates from a KVCacheConfig."""
    group = kv_cache_config.kv_cache_groups[0]
    spec = group.kv_cache_spec
    out: dict[str, torch.Tensor] = {}
    for t in kv_cache_config.kv_cache_tensors:
        rows = t.size // spec.page_size_bytes * spec.block_size
        for name in t.shared_by:
            out[name] = torch.empty(rows, spec.num_kv_heads, spec.head_size, dtype=dtype, device=device)
    return out


class BlockKVCache(DynamicCache):
    """A DynamicCache whose keys/values live in the rollout's preallocated KV tensors."""

    def __init__(self, layers: list[torch.Tensor], slot_tokens: int, qk_dim: int, batch: int) -> None:
        super().__init__()
        rows = layers[0].shape[0]
        if batch * slot_tokens > rows:
            raise RuntimeError(f"KV cache holds {rows} token rows; {batch} sequences need {batch * slot_tokens}")
        self._layers = [t[: batch * slot_tokens].view(batch, slot_tokens, *t.shape[1:]) for t in layers]
        self._qk, self._len = qk_dim, [0] * len(layers)
        self._slot_tokens = slot_tokens

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, cache_kwargs: dict | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        buf, start, n = self._layers[layer_idx], self._len[layer_idx], key_states.shape[-2]
        if start + n > self._slot_tokens:
            raise RuntimeError(f"sequence longer than max_model_len ({self._slot_tokens} cached tokens)")
        if layer_idx == 0:
            self._seen_tokens += n
        buf[:, start : start + n, :, : self._qk] = key_states.transpose(1, 2)
        buf[:, start : start + n, :, self._qk :] = value_states.transpose(1, 2)
        self._len[layer_idx] = start + n
        kv = buf[:, : start + n].transpose(1, 2)  # [B, H, T, qk+v]
        keys, values = kv[..., : self._qk], kv[..., self._qk :]
        while len(self.key_cache) <= layer_idx:
            self.key_cache.append(torch.tensor([]))
            self.value_cache.append(torch.tensor([]))
        self.key_cache[layer_idx], self.value_cache[layer_idx] = keys, values
        return keys, values

    def get_seq_length(self, layer_idx: int | None = 0) -> int:
        return self._len[layer_idx or 0]
