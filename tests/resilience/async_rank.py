"""One rank of the asynchronous hang scenarios (run as a script by test_async_hang.py).

Three steps of "update" with four micro-batches of 0.3 s each. Per micro-batch: the progress mark, an all_reduce
issued with ``async_op=True`` (it returns at enqueue, as an HCCL collective does), host work while it is in
flight, and the wait for the PREVIOUS micro-batch's collective: the host blocks one micro-batch later than
the collective a missing peer never joins, never inside it.

The last rank misbehaves entering micro-batch 3 of step 2, per `mode`: killed (SIGKILL), frozen (SIGSTOP),
stuck in Python (a sleep loop; its heartbeat goes on), slow (0.7 time-out there and again at micro-batch
4: late but alive), or none.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from verl_patches.resilience import heartbeat, progress

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
mode, timeout_s = sys.argv[1], float(sys.argv[2])
store = dist.TCPStore(
    os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=60)
)
dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=600))
heartbeat.start_with_store(store, rank, timeout_s)
faulty = rank == world - 1
MICRO_BATCH_S = 0.3  # longer than a heartbeat interval, as a micro-batch of a real model is


def misbehave(micro: int) -> None:
    print(f"rank {rank}: fault {mode} at {time.time():.3f}", flush=True)
    if mode == "killed":
        os.kill(os.getpid(), signal.SIGKILL)
    elif mode == "frozen":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif mode == "python":
        while True:
            time.sleep(0.05)
    elif mode == "slow":
        time.sleep(0.7 * timeout_s)


previous = None
for step in (1, 2, 3):
    progress.enter_call("update_actor", step, "update")
    progress.begin_group()
    for micro in range(1, 5):
        if faulty and step == 2 and (micro == 3 or (micro == 4 and mode == "slow")) and mode != "none":
            misbehave(micro)
        progress.unit("micro-batch", micro, 4)
        t = torch.full((4096,), float(rank + 1))
        work = dist.all_reduce(t, async_op=True)
        torch.randn(128, 128) @ torch.randn(128, 128)  # host work while the collective is in flight
        time.sleep(MICRO_BATCH_S)
        if previous is not None:
            previous[0].wait()
            assert previous[1][0].item() == world * (world + 1) / 2
        previous = (work, t)
    previous[0].wait()
    previous = None
    progress.leave_call()
print(f"rank {rank}: done", flush=True)
