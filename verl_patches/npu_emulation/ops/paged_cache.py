"""The paged KV cache that vllm-ascend's MLA keeps, read and written as the ATB ops do, in plain torch.

A cache is (num_blocks, block_size, *tail): slot s is row s % block_size of block s // block_size. A block
table row lists the blocks of one sequence in order, so token p of that sequence sits in block
block_table[b, p // block_size] at row p % block_size. Negative slots are padding (vLLM's PAD_SLOT_ID):
their writes are skipped, as the NPU kernels skip them.

torch_npu._npu_reshape_and_cache  write key/value rows to their slots (in place)
torch_npu.atb.npu_paged_cache_load  gather each sequence's tokens [start, start + len) into one run
"""

from __future__ import annotations

import torch


def _slot_coordinates(slots: torch.Tensor, cache: torch.Tensor, what: str) -> tuple[torch.Tensor, torch.Tensor]:
    block_size = cache.shape[1]
    capacity = cache.shape[0] * block_size
    if slots.numel() and int(slots.max()) >= capacity:
        raise IndexError(f"{what}: slot {int(slots.max())} is beyond the cache's {capacity} slots")
    return torch.div(slots, block_size, rounding_mode="floor"), slots % block_size


def write_slots(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor, what: str) -> None:
    """cache[slot] = row for each (slot, row) with slot >= 0, in place; rows is [T, *cache.shape[2:]]."""
    slots = slots.reshape(-1).long()
    if rows.shape[0] != slots.shape[0] or tuple(rows.shape[1:]) != tuple(cache.shape[2:]):
        raise ValueError(
            f"{what}: {slots.shape[0]} slots and rows of shape {tuple(rows.shape)} do not fit a cache of shape "
            f"{tuple(cache.shape)} (rows must be [num_slots, {', '.join(map(str, cache.shape[2:]))}])"
        )
    keep = slots >= 0
    blocks, offsets = _slot_coordinates(slots[keep], cache, what)
    cache[blocks, offsets] = rows[keep].to(cache.dtype)


def npu_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_indices: torch.Tensor,
) -> None:
    """torch_npu._npu_reshape_and_cache: key_cache[slot] = key[t], value_cache[slot] = value[t] for slot =
    slot_indices[t] >= 0. key [T, N, Dk], value [T, N, Dv], caches (num_blocks, block_size, N, D)."""
    write_slots(key_cache, slot_indices, key, "_npu_reshape_and_cache key")
    write_slots(value_cache, slot_indices, value, "_npu_reshape_and_cache value")


def _sequence_tokens(
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    seq_starts: torch.Tensor | None,
    cumsum: bool,
    block_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(block, row) of every token gathered, sequence after sequence."""
    lens = context_lens.reshape(-1).long().cpu()
    if cumsum:
        lens = torch.diff(lens, prepend=lens.new_zeros(1))
    if lens.numel() != block_table.shape[0]:
        raise ValueError(
            f"npu_paged_cache_load: context_lens gives {lens.numel()} sequences, block_table has {block_table.shape[0]}"
        )
    if (lens < 0).any():
        raise ValueError(f"npu_paged_cache_load: context_lens must be non-negative, got {lens.tolist()}")
    device = block_table.device
    seq_of_token = torch.repeat_interleave(torch.arange(lens.numel()), lens).to(device)
    first_token = (torch.cumsum(lens, 0) - lens).to(device)
    position = torch.arange(int(lens.sum()), device=device) - first_token[seq_of_token]
    if seq_starts is not None:
        position = position + seq_starts.reshape(-1).long().to(device)[seq_of_token]
    column = torch.div(position, block_size, rounding_mode="floor")
    if column.numel() and int(column.max()) >= block_table.shape[1]:
        raise IndexError(
            f"npu_paged_cache_load: token {int(position.max())} needs block-table column {int(column.max())}, "
            f"the table has {block_table.shape[1]}"
        )
    return block_table.long()[seq_of_token, column], position % block_size


def npu_paged_cache_load(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    seq_starts: torch.Tensor | None = None,
    cumsum: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """torch_npu.atb.npu_paged_cache_load: for each sequence b, its tokens seq_starts[b] (a token offset, 0
    without seq_starts) up to seq_starts[b] + context_lens[b], concatenated over b: key [sum(lens), N, Dk],
    value [sum(lens), N, Dv]. With cumsum, context_lens holds cumulative ends instead of lengths."""
    if key_cache.dim() != 4 or value_cache.dim() != 4:
        raise NotImplementedError(
            "npu_paged_cache_load on CPU: only ND caches (num_blocks, block_size, N, D) are emulated, got "
            f"{tuple(key_cache.shape)} / {tuple(value_cache.shape)} (NZ caches come only with enable_kv_nz)"
        )
    if key_cache.shape[:2] != value_cache.shape[:2]:
        raise ValueError(
            f"npu_paged_cache_load: key_cache {tuple(key_cache.shape)} and value_cache {tuple(value_cache.shape)} "
            "differ in (num_blocks, block_size)"
        )
    blocks, rows = _sequence_tokens(block_table, context_lens, seq_starts, cumsum, key_cache.shape[1])
    return key_cache[blocks, rows], value_cache[blocks, rows]


def npu_paged_cache_load_out(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    seq_starts: torch.Tensor | None = None,
    cumsum: bool = False,
    key: torch.Tensor,
    value: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The out= form vllm-ascend calls: writes into key and value, whose first dim must be sum(lens)."""
    k, v = npu_paged_cache_load(key_cache, value_cache, block_table, context_lens, seq_starts=seq_starts, cumsum=cumsum)
    for name, dst, src in (("key", key, k), ("value", value, v)):
        if dst.numel() != src.numel() or dst.shape[0] != src.shape[0]:
            raise ValueError(
                f"npu_paged_cache_load: out {name} has shape {tuple(dst.shape)}, the gathered tokens are "
                f"{tuple(src.shape)}"
            )
        dst.copy_(src.view(dst.shape))
    return key, value
