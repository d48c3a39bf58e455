"""Run a function on N CPU processes joined by gloo on 127.0.0.1, with a hard time bound.

Each rank returns a JSON-able dict (``{"ok": ...}`` or ``{"error": traceback}``) that the parent reads back.
The overlay is activated in each child before the target runs, as in a Ray worker.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import traceback
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    target: Callable[..., Any], rank: int, world: int, port: int, out_dir: str, timeout_s: float, kwargs: dict
) -> None:
    torch.set_num_threads(1)
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        LOCAL_WORLD_SIZE=str(world),
    )
    import torch.distributed as dist

    import verl_patches.prelude_patch  # noqa: F401  (the overlay, as every worker process has it)

    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        result = {"ok": target(rank, world, **kwargs)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    os._exit(0)  # skip interpreter teardown of half-closed gloo groups


def run_ranks(target: Callable[..., Any], world: int, timeout_s: float = 120.0, **kwargs: Any) -> list[Any]:
    """Start ``world`` processes running ``target(rank, world, **kwargs)``; return each rank's result."""
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_entry, args=(target, r, world, port, tmp, timeout_s * 0.8, kwargs))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout_s)
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        if hung:
            raise TimeoutError(f"ranks {hung} did not finish within {timeout_s}s")
        out = []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.json")
            if not os.path.exists(path):
                raise RuntimeError(f"rank {r} exited with code {procs[r].exitcode} and wrote no result")
            with open(path) as f:
                out.append(json.load(f))
    errors = [f"--- rank {r} ---\n{res['error']}" for r, res in enumerate(out) if "error" in res]
    if errors:
        raise AssertionError("\n".join(errors))
    return [res["ok"] for res in out]
