"""Per-rank memory of a run, measured in every worker process after each step (issue 15 item 4).

verl reports memory from one worker only. The driver asks every worker process of the actor/rollout
group for its peak (`probe`, run inside the worker through Ray's ``__ray_call__``): device memory where
there is an accelerator (peak allocated by the caching allocator), the process's peak resident set size
on the CPU. Each step adds ``memory/peak_gib_max`` / ``_min`` / ``_mean`` and ``memory/peak_rank`` to the
step metrics, and appends one JSON line with every rank to ``<run dir>/rank_memory.jsonl`` (the run dir is
``VERL_PATCHES_RUN_DIR``, else the parent of ``TENSORBOARD_DIR``, which our launcher sets to
``logs/<run>/tensorboard``), where `verl_patches.driver.run_metrics` reads it.
"""

from __future__ import annotations

import json
import logging
import os
import resource
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches import device
from verl_patches.base import env_registry

logger = logging.getLogger("verl_patches")
GIB = float(1 << 30)
FILE_NAME = "rank_memory.jsonl"
RUN_DIR_ENV = "VERL_PATCHES_RUN_DIR"


def probe(_worker: Any = None) -> dict[str, Any]:
    """This process's memory (called inside a worker; `_worker` is the actor instance Ray passes)."""

    mod = device.accelerator_module()
    rank = env_registry.integer("RANK", default=-1)
    if mod is not None:
        return {
            "rank": rank,
            "pid": os.getpid(),
            "kind": "device",
            "peak_gib": mod.max_memory_allocated() / GIB,
            "current_gib": mod.memory_allocated() / GIB,
        }
    # lazy: only this path needs psutil; importing this module stays light
    import psutil

    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: KiB
    return {
        "rank": rank,
        "pid": os.getpid(),
        "kind": "host",
        "peak_gib": peak_kib * 1024 / GIB,
        "current_gib": psutil.Process().memory_info().rss / GIB,
    }


def collect(worker_group: Any, timeout_s: float = 60.0) -> list[dict[str, Any]] | None:
    """Every worker's `probe`, in worker order; None when the group has no Ray workers (tests, fakes)."""
    workers = getattr(worker_group, "_workers", None)
    if not workers:
        return None
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray

    rows = ray.get([w.__ray_call__.remote(probe) for w in workers], timeout=timeout_s)
    for i, row in enumerate(rows):
        if row["rank"] < 0:
            row["rank"] = i
    return sorted(rows, key=lambda r: r["rank"])


def summary_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Step metrics from the per-rank rows (pure)."""
    if not rows:
        return {}
    peaks = [float(r["peak_gib"]) for r in rows]
    top = max(range(len(rows)), key=lambda i: peaks[i])
    return {
        "memory/peak_gib_max": max(peaks),
        "memory/peak_gib_min": min(peaks),
        "memory/peak_gib_mean": sum(peaks) / len(peaks),
        "memory/peak_rank": float(rows[top]["rank"]),
    }


def run_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    env = os.environ if environ is None else environ
    if env.get(RUN_DIR_ENV):
        return Path(env[RUN_DIR_ENV])
    if env.get("TENSORBOARD_DIR"):
        return Path(env["TENSORBOARD_DIR"]).parent
    return None


def append(path: Path, step: int, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "ranks": rows}) + "\n")


class StepMemory:
    """The per-step hook of the fit loop: probe, summarise, record; a failure is logged once, never raised."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        d = run_dir(environ)
        self.path = None if d is None else d / FILE_NAME
        self._broken = False

    def __call__(self, worker_group: Any, step: int) -> dict[str, float]:
        if self._broken:
            return {}
        try:
            rows = collect(worker_group)
        except Exception as e:  # a probe must never stop training
            self._broken = True
            logger.warning("per-rank memory probe disabled after an error: %s: %s", type(e).__name__, e)
            return {}
        if rows is None:
            return {}
        if self.path is not None:
            append(self.path, step, rows)
        return summary_metrics(rows)
