"""One rank of the hang scenarios (run as a script by test_collective_watchdog.py)."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import verl_patches.prelude_patch  # noqa: F401  (the declared torch.distributed patches, as in every worker)

import torch
import torch.distributed as dist

from verl_patches.resilience import collective_watchdog

rank, world, mode = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), sys.argv[1]
dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
assert getattr(dist.all_reduce, "__verl_patches_watched__", None) == "all_reduce", "watchdog patch not applied"
for step in (4, 5):
    collective_watchdog.set_step(step)
    t = torch.ones(4)
    dist.all_reduce(t)
    assert t.tolist() == [float(world)] * 4
    dist.barrier()
print(f"rank {rank}: steps done", flush=True)
if rank == world - 1:
    if mode == "frozen":
        os.kill(os.getpid(), signal.SIGSTOP)  # a stuck peer: no collective, no heartbeat
    else:
        time.sleep(600)  # alive, but never joins the next collective
dist.all_reduce(torch.ones(4))
print(f"rank {rank}: unexpectedly finished", flush=True)
