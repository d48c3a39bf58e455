"""B1: the MEGATRON_COMPUTE_PROTO dispatch tells the workers which Megatron DP rank every global rank has.

The worker-side D2D reshard (`verl_patches.reshard.dp_plan`, C2) moves rollout chunks (one per global
rank) into Megatron's data-parallel slices without a trip through the driver; for that every worker needs
the map global rank → Megatron DP rank. The driver knows it (``worker_group.get_megatron_rank_info``), so
the dispatch writes it into the first DataProto argument's ``meta_info`` before chunking, as upstream
chunks it; the chunks share ``meta_info``, so every worker receives the map.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.worker_calls.meta_keys import DP_RANKS_META_KEY

MODE = "MEGATRON_COMPUTE_PROTO"


def megatron_dp_ranks(worker_group: Any) -> list[int]:
    """Megatron DP rank of every global rank of the worker group, in global-rank order."""
    return [int(worker_group.get_megatron_rank_info(rank).dp_rank) for rank in range(worker_group.world_size)]


def annotate_dp_ranks(dispatch_fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(dispatch_fn)
    def dispatch(worker_group: Any, *args: Any, **kwargs: Any) -> Any:
        if args and hasattr(args[0], "meta_info"):
            args[0].meta_info[DP_RANKS_META_KEY] = megatron_dp_ranks(worker_group)
        return dispatch_fn(worker_group, *args, **kwargs)

    return dispatch


def with_dp_rank_map(get_predefined_dispatch_fn: Callable[..., dict]) -> Callable[..., dict]:
    """Wrap verl's dispatch lookup: MEGATRON_COMPUTE_PROTO's dispatch_fn annotates, collect_fn unchanged."""

    @functools.wraps(get_predefined_dispatch_fn)
    def lookup(dispatch_mode: Any) -> dict:
        fns = get_predefined_dispatch_fn(dispatch_mode)
        if getattr(dispatch_mode, "name", None) != MODE:
            return fns
        return {**fns, "dispatch_fn": annotate_dp_ranks(fns["dispatch_fn"])}

    return lookup
