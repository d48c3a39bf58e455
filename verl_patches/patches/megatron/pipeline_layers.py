"""D4: uneven pipeline stages from `num_layer_list` (61 DeepSeek-V3 layers over 8 stages: 7,7,8,8,8,8,8,7).

Megatron core_r0.8.0 builds num_layers // pp layers per stage and offsets layer numbers by the same
even split: 56 of 61 layers would exist and the dense/MoE boundary would move. The pure functions
below are the whole rule; the wrappers apply it when a config carries `num_layer_list`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any


def parse_num_layer_list(value: Any) -> list[int] | None:
    """A list/tuple of ints, or text like "7,7,8" / "[7, 7, 8]"; None or empty -> None."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = [p for p in value.strip().strip("[]").replace(" ", "").split(",") if p]
    else:
        parts = list(value)
    if not parts:
        return None
    try:
        counts = [int(p) for p in parts]
    except (TypeError, ValueError):
        raise ValueError(f"num_layer_list={value!r}: expected integers separated by commas") from None
    if any(c < 1 for c in counts):
        raise ValueError(f"num_layer_list={counts}: every pipeline stage needs at least one layer")
    return counts


def layer_offsets(counts: Sequence[int]) -> list[int]:
    """Prefix sums [0, c0, c0+c1, ..., total] (length pp + 1): stage i builds layers offsets[i]..offsets[i+1]-1."""
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def check_layout(counts: Sequence[int], num_layers: int, pp_size: int) -> None:
    if len(counts) != pp_size:
        raise ValueError(f"num_layer_list={list(counts)} has {len(counts)} entries for pipeline size {pp_size}")
    if sum(counts) != num_layers:
        raise ValueError(f"num_layer_list={list(counts)} sums to {sum(counts)}, the model has {num_layers} layers")


def _uneven_counts(config: Any) -> list[int] | None:
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state

    counts = parse_num_layer_list(getattr(config, "num_layer_list", None))
    if counts is None:
        return None
    if parallel_state.get_virtual_pipeline_model_parallel_world_size() is not None:
        raise ValueError("num_layer_list with virtual pipeline stages is not supported (the A3 profile uses none)")
    check_layout(counts, config.num_layers, parallel_state.get_pipeline_model_parallel_world_size())
    config.num_layer_list = counts
    config.layer_offset = layer_offsets(counts)
    return counts


def uneven_num_layers_to_build(original: Callable[[Any], int]) -> Callable[[Any], int]:
    @functools.wraps(original)
    def get_num_layers_to_build(config: Any) -> int:
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core import parallel_state

        counts = _uneven_counts(config)
        if counts is None:
            return original(config)
        return counts[parallel_state.get_pipeline_model_parallel_rank()]

    return get_num_layers_to_build


def uneven_layer_offset(original: Callable[[Any], int]) -> Callable[[Any], int]:
    @functools.wraps(original)
    def _get_layer_offset(self: Any) -> int:
        # deferred: a patch applies while upstream is still importing; Megatron is read at call time
        from megatron.core import parallel_state

        counts = _uneven_counts(self.config)
        if counts is None:
            return original(self)
        return self.config.layer_offset[parallel_state.get_pipeline_model_parallel_rank()]

    return _get_layer_offset
