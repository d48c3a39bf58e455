"""Run a function on N CPU processes joined by gloo on 127.0.0.1, with a hard time bound.

The target runs named scenarios and returns ``{scenario: "ok" | traceback}``; each rank writes its dict
to a JSON file the parent reads back, so one spawn serves many test functions.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verl_patches.reshard.rank_exit import exit_rank


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_scenarios(scenarios: dict[str, Callable[[int, int], None]], rank: int, world: int) -> dict[str, str]:
    """Run every scenario in order on this rank; a failure is recorded, the rest still run.

    Scenarios are collective: a rank that fails mid-scenario may leave peers waiting, which the gloo
    timeout turns into errors on those peers rather than a hang.
    """
    results = {}
    for name, fn in scenarios.items():
        try:
            fn(rank, world)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    return results


def _entry(target, rank: int, world: int, port: int, out_dir: str, timeout_s: float, deadline_s: float) -> None:
    # a rank still running shortly before the parent kills it prints every thread's stack to stderr (which
    # pytest shows with the failure): where it hung, not only that it did
    faulthandler.dump_traceback_later(max(deadline_s - 5.0, 1.0), exit=False)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
    )
    status = 1
    try:
        result = target(rank, world)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        status = 0
    except BaseException:
        traceback.print_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        exit_rank(status)  # not destroy_process_group: see rank_exit


def run_ranks(
    target: Callable[[int, int], dict[str, str]], world: int, timeout_s: float = 90.0
) -> list[dict[str, str]]:
    """Start ``world`` processes running ``target(rank, world)``; return each rank's result dict."""
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        procs = [
            ctx.Process(target=_entry, args=(target, r, world, port, tmp, timeout_s / 4, timeout_s))
            for r in range(world)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(deadline - time.monotonic(), 0.0))
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in hung:
            procs[r].kill()
            procs[r].join()
        if hung:
            raise TimeoutError(f"ranks {hung} did not finish within {timeout_s}s")
        bad = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode != 0]
        if bad:
            raise RuntimeError(f"ranks exited abnormally (rank, exit code): {bad}")
        out = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                out.append(json.load(f))
        return out


def assert_scenario(results: list[dict[str, str]], name: str) -> None:
    failures = {r: res.get(name, "scenario did not run") for r, res in enumerate(results) if res.get(name) != "ok"}
    assert not failures, "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in failures.items())
