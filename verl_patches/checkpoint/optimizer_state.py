"""The distributed optimizer's DP-gathered parameter state: taken for a save, and loaded without Megatron's bare
``torch.load``.

Load: Megatron's ``DistributedOptimizer.load_parameter_state`` and ``ChainedOptimizer.load_parameter_state``
read the file with ``torch.load(filename)``, which on torch < 2.6 unpickles anything. This does what they
do (DP rank 0 of each optimizer reads the file, every rank takes part in the scatter of
``load_parameter_state_from_dp_zero``), with the file read by `safe_load.load_tensor_file`: weights only,
its sha256 checked against the step manifest before it is read. The scatter itself stays Megatron's (or
MindSpeed's replacement of it), so no upstream code is patched.

Save (`parameter_state_for_save`): what ``save_parameter_state`` would hand ``torch.save``, taken apart from the
write so that the write can run in the background (`background_write`). An optimizer whose data-parallel group
has more than one rank is gathered by Megatron's (or MindSpeed's) ``get_parameter_state_dp_zero``: a collective,
so it runs where the save is called, into new host buffers. An optimizer whose group is this rank alone (the
experts' on A3: expert-DP 1) needs no gather, and its "world" tensors are its own state laid end to end: they
are kept as a list of pieces instead (each key's pieces concatenate to exactly the tensor Megatron would
build, zeros where the buffer pads), which are views of the host buffers the swap optimizer keeps the state in,
not a copy (state on the device is copied to the host). The loader concatenates them. Those host buffers are
live: the next optimizer step writes into them, hence the fence before it (`background_write`).

The upstream methods mirrored here are pinned by `MIRRORED` (a test compares their fingerprints with the trees).
"""

from __future__ import annotations

import os
from typing import Any

from verl_patches import device
from verl_patches.checkpoint.safe_load import CheckpointFileError, load_tensor_file

# the upstream definitions this module mirrors -> their fingerprint (verl_patches.patching.fingerprint)
MIRRORED = {
    "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.load_parameter_state": "sha256:34bdddc8a49f61e1",
    "megatron.core.optimizer.optimizer:ChainedOptimizer.load_parameter_state": "sha256:553b8a70dc75dfad",
    # the save side: which rank writes (DP rank 0 of any chained optimizer) and the world tensors' layout
    "megatron.core.optimizer.optimizer:ChainedOptimizer.save_parameter_state": "sha256:d2b7d225b6c3808c",
    "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.save_parameter_state": "sha256:9b3b1bb9bdd484f8",
    "megatron.core.optimizer.distrib_optimizer:DistributedOptimizer.get_parameter_state_dp_zero": (
        "sha256:a90509030096f067"
    ),
    # MindSpeed's swap optimizer: the state of a swapped parameter is read from its host copies
    "mindspeed.core.optimizer.swap_optimizer:SwapDistributedOptimizer.get_parameter_state_dp_zero": (
        "sha256:728e5874d0ed904d"
    ),
}
STATE_KEYS = ("param", "exp_avg", "exp_avg_sq")  # the tensors of each world state, in Megatron's order


def _dp_rank(optimizer: Any) -> int:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    return torch.distributed.get_rank(optimizer.data_parallel_group)


def load_parameter_state(optimizer: Any, path: str | os.PathLike[str], expected_sha256: str) -> None:
    """Restore a (chained) distributed optimizer's parameter state from ``path``; a collective over DP."""
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is None:
        state = load_tensor_file(path, expected_sha256=expected_sha256) if _dp_rank(optimizer) == 0 else None
        if state is not None and not isinstance(state, dict):
            raise CheckpointFileError(
                f"{path}: expected the distributed optimizer's state dict, found {type(state).__name__}"
            )
        optimizer.load_parameter_state_from_dp_zero(coalesced(state, path))
        return
    states = None
    for idx, inner in enumerate(chained):
        if not hasattr(inner, "load_parameter_state_from_dp_zero"):
            continue
        if _dp_rank(inner) == 0 and states is None:  # read once, by a rank that is DP rank 0 of some optimizer
            states = load_tensor_file(path, expected_sha256=expected_sha256)
            if not isinstance(states, list) or len(states) != len(chained):
                raise CheckpointFileError(
                    f"{path}: expected a list of {len(chained)} optimizer states, found "
                    f"{type(states).__name__}"
                    f"{f' of {len(states)}' if isinstance(states, list) else ''}"
                )
        inner.load_parameter_state_from_dp_zero(coalesced(states[idx], path) if states else None)


def coalesced(state: Any, path: str | os.PathLike[str]) -> Any:
    """``state`` with every world tensor saved as pieces (`parameter_state_for_save`) concatenated into the one
    tensor Megatron's scatter reads; a piece list that does not add up to ``numel_unpadded`` is refused naming
    ``path``."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    if not isinstance(state, dict):
        return state
    out: dict[Any, Any] = {}
    for gbuf, by_dtype in state.items():
        if not isinstance(by_dtype, dict):
            out[gbuf] = by_dtype
            continue
        out[gbuf] = {}
        for dtype, world in by_dtype.items():
            if not isinstance(world, dict):
                out[gbuf][dtype] = world
                continue
            world = dict(world)
            for key in STATE_KEYS:
                pieces = world.get(key)
                if isinstance(pieces, list):
                    if not pieces or not all(isinstance(t, torch.Tensor) for t in pieces):
                        raise CheckpointFileError(f"{path}: buffer {gbuf} {key}: expected a list of tensors")
                    world[key] = torch.cat([t.reshape(-1) for t in pieces])
                    if world[key].numel() != world.get("numel_unpadded"):
                        raise CheckpointFileError(
                            f"{path}: buffer {gbuf} {key}: the pieces hold {world[key].numel()} values, "
                            f"numel_unpadded is {world.get('numel_unpadded')!r}"
                        )
            out[gbuf][dtype] = world
    return out


def _swap_host_states(inner: Any) -> dict[Any, Any] | None:
    """MindSpeed's swap optimizer keeps each main parameter's state in host buffers (a class-level map):
    main param -> {"param", "exp_avg", "exp_avg_sq", ...}; None for any other optimizer."""
    found = getattr(type(inner), "param_to_cpu_states_map", None)
    return found if isinstance(found, dict) else None


def _local_pieces(inner: Any) -> dict[Any, Any] | None:
    """The world state of an optimizer whose data-parallel group is this rank alone, as pieces (module docstring),
    or None when its buffers are not laid out as expected (the caller then lets Megatron gather)."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    host = _swap_host_states(inner)
    state: dict[Any, Any] = {"buckets_coalesced": True}
    gaps: list[torch.Tensor] = []  # one zeros buffer: every gap is a view of it (one storage in the file)

    def zeros(n: int) -> torch.Tensor:
        if not gaps or gaps[0].numel() < n:
            gaps[:] = [torch.zeros(max(n, 1024), dtype=torch.float32)]
        return gaps[0][:n]

    for gbuf_idx, gbuf_range_maps in enumerate(inner.gbuf_ranges):
        if len(gbuf_range_maps) != 1:
            return None
        dtype_state = {}
        for dtype, ranges_for_all_buckets in gbuf_range_maps.items():
            buffer = inner.buffers[gbuf_idx]
            pieces: dict[str, list[torch.Tensor]] = {key: [] for key in STATE_KEYS}
            total = 0
            for bucket_idx, gbuf_range_map in enumerate(ranges_for_all_buckets):
                unpadded = buffer.buckets[bucket_idx].numel_unpadded
                spans = []
                for model_param, ranges in gbuf_range_map["param_map"].items():
                    group_index, group_order = inner.model_param_group_index_map[model_param]
                    main_param = inner.optimizer.param_groups[group_index]["params"][group_order]
                    if host is not None and main_param in host:
                        tensors = host[main_param]
                    else:
                        tensors = {"param": main_param, **inner.optimizer.state[main_param]}
                    spans.append((ranges["gbuf_local"].start, ranges["gbuf_local"].end, tensors))
                at = 0
                for start, end, tensors in sorted(spans, key=lambda s: s[0]):
                    if start < at or end > unpadded:
                        return None
                    for key in STATE_KEYS:
                        t = tensors.get(key)
                        if not isinstance(t, torch.Tensor) or t.numel() != end - start or t.dtype != torch.float32:
                            return None
                        if start > at:
                            pieces[key].append(zeros(start - at))
                        # a host tensor is kept as it is (no copy: the fence guards it); one on the device
                        # is copied to the host here, as Megatron's gather copies it
                        pieces[key].append(t.detach().reshape(-1) if t.device.type == "cpu" else t.detach().cpu())
                    at = end
                if at < unpadded:
                    for key in STATE_KEYS:
                        pieces[key].append(zeros(unpadded - at))
                total += unpadded
            if total != buffer.numel_unpadded:
                return None
            dtype_state[dtype] = {**pieces, "numel_unpadded": buffer.numel_unpadded}
        state[gbuf_idx] = dtype_state
    return state


def _world_state(inner: Any) -> Any:
    """One distributed optimizer's world state: pieces when its DP group is this rank alone, else Megatron's
    (or MindSpeed's) gather, a collective over its DP group (gloo)."""
    if inner.data_parallel_group_gloo.size() == 1:
        pieces = _local_pieces(inner)
        if pieces is not None:
            return pieces
    return inner.get_parameter_state_dp_zero()


def parameter_state_for_save(optimizer: Any) -> Any | None:
    """What Megatron's ``save_parameter_state`` would ``torch.save`` on this rank, or None when this rank writes
    no file (it is DP rank 0 of none of the optimizers). A collective over the DP groups: every rank calls it,
    in the same order. Waits for the device first (the swap optimizer copies its state to the host on a side
    stream)."""
    device.synchronize()
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained is None:
        state = _world_state(optimizer)
        return state if _dp_rank(optimizer) == 0 else None
    states: list[Any] = []
    save = False
    for inner in chained:
        if hasattr(inner, "get_parameter_state_dp_zero"):
            state = _world_state(inner)
            if _dp_rank(inner) == 0:
                states.append(state)
                save = True
            else:
                states.append(None)
        else:
            states.append(None)
    return states if save else None
