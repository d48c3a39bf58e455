"""Run independent conversion tasks with a bounded number of worker threads and a byte-based progress bar.

Threads, not processes: the work is torch kernels, hashing and file I/O, which all release the GIL, so
threads run in parallel without a process start-up per worker (importing torch costs about a second each)
and without pickling tasks. Each worker holds one task's working set (a tensor, a shard or a rank), so
peak memory is ``workers x one task``. While workers > 1, torch's intra-op threads are divided among them
(restored afterwards) so the machine is not oversubscribed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TypeVar

import torch
from tqdm import tqdm

T = TypeVar("T")
R = TypeVar("R")


def progress_bar(total_bytes: int, desc: str, enabled: bool = True) -> tqdm:
    """A tqdm bar on stderr counting bytes, so its rate and ETA are in GB/s and wall time."""
    return tqdm(
        total=total_bytes,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        smoothing=0.1,
    )


def run_tasks(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    weights: Sequence[int],
    *,
    workers: int = 1,
    on_result: Callable[[T, R], None] | None = None,
    desc: str = "",
    progress: bool = True,
) -> list[R]:
    """Apply ``fn`` to each task; ``on_result`` runs in the calling thread as each one finishes.

    ``weights`` (bytes per task) drive the progress bar. At most ``workers`` tasks are in flight, so
    memory stays bounded however many tasks there are. The first failure stops submitting, waits for
    the tasks in flight and is re-raised.
    """
    results: list[R] = []
    with progress_bar(sum(weights), desc, progress) as bar:
        if workers <= 1 or len(tasks) <= 1:
            for task, w in zip(tasks, weights):
                r = fn(task)
                if on_result:
                    on_result(task, r)
                results.append(r)
                bar.update(w)
            return results
        threads = torch.get_num_threads()
        torch.set_num_threads(max(1, threads // workers))
        queue = list(zip(tasks, weights))
        pending: dict[Future, tuple[T, int]] = {}
        try:
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=desc or "convert") as pool:
                try:
                    while queue or pending:
                        while queue and len(pending) < workers:
                            task, w = queue.pop(0)
                            pending[pool.submit(fn, task)] = (task, w)
                        done, _ = wait(pending, return_when=FIRST_COMPLETED)
                        for fut in done:
                            task, w = pending.pop(fut)
                            r = fut.result()
                            if on_result:
                                on_result(task, r)
                            results.append(r)
                            bar.update(w)
                except BaseException:
                    for fut in pending:
                        fut.cancel()
                    raise
        finally:
            torch.set_num_threads(threads)
    return results
