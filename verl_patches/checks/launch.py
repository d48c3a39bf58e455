"""Start the check's ranks on this host: one process per rank, joined by the device's collective backend
(gloo on 127.0.0.1 on a CPU host, HCCL on A3; `verl_patches.device`), bounded in time.

Each rank runs ``target(rank, world, **kwargs)`` with the overlay active (as in a Ray worker) and reports
``ok`` or its traceback; a rank that hangs is killed at the deadline and named. A rank's own output (Megatron
and vLLM are verbose) goes to ``rank{r}.log``; the tail of a failing rank's log is part of the error.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import traceback
from datetime import timedelta
from typing import Any, Callable


class RankFailure(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    target: Callable[..., Any], rank: int, world: int, port: int, status_dir: str, timeout_s: float, kwargs: dict
) -> None:
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    log = os.open(os.path.join(status_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    result: dict[str, Any]
    try:
        import torch
        import torch.distributed as dist

        import verl_patches.prelude_patch  # noqa: F401  (the overlay, as every worker process has it)
        from verl_patches.device import device_kind, dist_backend

        if device_kind() == "cpu":
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        else:
            from verl_patches.device import accelerator_module

            accelerator_module().set_device(rank)
        dist.init_process_group(
            dist_backend(),
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        result = {"ok": target(rank, world, **kwargs)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(status_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    from verl_patches.reshard.rank_exit import exit_rank

    exit_rank(0)  # the status is in the file; no teardown of the process groups (rank_exit says why)


def run_ranks(target: Callable[..., Any], world: int, timeout_s: float, **kwargs: Any) -> list[Any]:
    """Run ``world`` ranks of ``target``; return each rank's result, or raise `RankFailure` naming the rank."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="check_logprobs_status_") as tmp:
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
            raise RankFailure(
                f"ranks {hung} did not finish within {timeout_s:g} s; rank {hung[0]}'s log ends:\n{_tail(tmp, hung[0])}"
            )
        out = []
        for r in range(world):
            path = os.path.join(tmp, f"rank{r}.json")
            if not os.path.exists(path):
                raise RankFailure(
                    f"rank {r} exited with code {procs[r].exitcode} and reported nothing; its log "
                    f"ends:\n{_tail(tmp, r)}"
                )
            with open(path) as f:
                out.append(json.load(f))
        errors = [f"--- rank {r} ---\n{res['error']}" for r, res in enumerate(out) if "error" in res]
        if errors:
            raise RankFailure("\n".join(errors))
    return [res["ok"] for res in out]


def _tail(status_dir: str, rank: int, lines: int = 30) -> str:
    try:
        with open(os.path.join(status_dir, f"rank{rank}.log"), errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return "(no log)"
