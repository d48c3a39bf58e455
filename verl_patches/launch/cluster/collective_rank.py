"""One rank of the cross-node collective check (`verl_patches.launch.cluster.collective_check`).

The rank joins the job-wide group through the head's rendezvous store with the device's backend (HCCL on A3,
gloo on a CPU host), then runs the two collectives the job's traffic is made of: an all-reduce (gradients,
the DP metadata of the rollout) and an all-to-all (MoE token dispatch, expert-parallel weight sync). Each is
checked for the values every rank must receive, then timed. A wrong value is an error naming the rank that
sent it; a rank that never arrives leaves its peers waiting, which the node's deadline turns into a report.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

from verl_patches.base import env_registry
from verl_patches.device import device_kind, dist_backend, set_local_device, synchronize, torch_device

STORE_PREFIX = "collective_check/group"  # the process group's keys, beside the check's own in the store


def expected_all_reduce(world: int) -> float:
    """Each rank contributes rank + 1: every rank must read the sum of 1..world."""
    return world * (world + 1) / 2


def all_to_all_problems(rank: int, world: int, received: list[float]) -> list[str]:
    """Rank `src` sends `src * world + dst` to each `dst`: which peers' values arrived wrong at `rank`."""
    out = []
    for src, value in enumerate(received):
        want = src * world + rank
        if value != want:
            out.append(f"from rank {src}: {value:g}, expected {want}")
    return out


def bus_bandwidth_gbs(nbytes: int, seconds: float, world: int, kind: str) -> float:
    """nccl-tests' bus bandwidth (GB/s): the algorithm bandwidth scaled by each collective's traffic factor."""
    if seconds <= 0:
        return 0.0
    factor = 2 * (world - 1) / world if kind == "all_reduce" else (world - 1) / world
    return nbytes / seconds * factor / 1e9


def timed_elements(nbytes: int, world: int) -> int:
    """float32 elements each rank moves in the timed collectives: about `nbytes`, an equal share for every peer."""
    return max(world, nbytes // 4 // world * world)


def _timed(fn: Any, iters: int, sync: Any) -> float:
    """Mean seconds of `fn` over `iters` runs after one warm-up, the device synchronised around them."""
    fn()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - start) / iters


def rank_check(
    local_rank: int, local_world: int, *, master: str, port: int, nbytes: int, iters: int, timeout_s: float
) -> dict:
    """Run on one rank (RANK and WORLD_SIZE in the environment are the job-wide ones); returns its report."""
    # deferred: torch is the rank's import (the node process that summarises the reports imports this module too)
    import torch
    import torch.distributed as dist

    rank, world = env_registry.integer("RANK"), env_registry.integer("WORLD_SIZE")
    kind = device_kind()
    index = set_local_device(kind)  # before the group: HCCL binds the current device
    device = torch_device(index)
    start = time.perf_counter()
    store = dist.TCPStore(master, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    dist.init_process_group(
        dist_backend(kind),
        store=dist.PrefixStore(STORE_PREFIX, store),
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )
    # the first collective builds the communicator (HCCL does it lazily): timed apart as the group's set-up
    probe = torch.tensor([float(rank + 1)], device=device)
    dist.all_reduce(probe)
    synchronize()
    setup_s = time.perf_counter() - start
    if probe.item() != expected_all_reduce(world):
        raise AssertionError(f"rank {rank}: all_reduce gave {probe.item():g}, expected {expected_all_reduce(world):g}")
    send = torch.tensor([float(rank * world + dst) for dst in range(world)], device=device)
    recv = torch.empty(world, device=device)
    dist.all_to_all_single(recv, send)
    synchronize()
    wrong = all_to_all_problems(rank, world, recv.cpu().tolist())
    if wrong:
        raise AssertionError(f"rank {rank}: all_to_all_single received wrong values: " + "; ".join(wrong[:8]))
    elements = timed_elements(nbytes, world)
    big = torch.ones(elements, dtype=torch.float32, device=device)
    out = torch.empty_like(big)
    reduce_s = _timed(lambda: dist.all_reduce(big), iters, synchronize)
    a2a_s = _timed(lambda: dist.all_to_all_single(out, big), iters, synchronize)
    size = elements * 4
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "device": str(device),
        "backend": dist_backend(kind),
        "setup_s": round(setup_s, 3),
        "bytes": size,
        "all_reduce_s": reduce_s,
        "all_to_all_s": a2a_s,
    }  # the head computes the bandwidths from these times (collective_report.summarize), never taken from here


__all__ = [
    "rank_check",
    "expected_all_reduce",
    "all_to_all_problems",
    "bus_bandwidth_gbs",
    "timed_elements",
    "STORE_PREFIX",
]
