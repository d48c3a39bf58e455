"""Which requests move from which DP rank to which (pure; no communication).

Graph batch sizes: `[max_bs] + sizes below max_bs, descending`. A rank with `c` running requests runs
the graph of `bucket(c)` = the smallest size >= c. The target is the smallest size `s` with
`mean count <= s < bucket(max count)`: if one exists, ranks above it give their surplus (their first
`count - s` requests) to ranks below it, receivers by spare capacity (largest first), donors taken
round-robin, `min(surplus, capacity)` per pair. Afterwards every rank holds at most `s` requests, so
the largest graph needed drops from bucket(max) to s. Without such an `s` there is nothing to gain.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Task:
    src: int
    dst: int
    request_ids: tuple[str, ...]


def graph_batch_sizes(max_bs: int, sizes: Sequence[int]) -> list[int]:
    if max_bs < 1:
        raise ValueError(f"max batch size must be positive, got {max_bs}")
    return [max_bs] + sorted({s for s in sizes if 0 < s < max_bs}, reverse=True)


def bucket(count: int, sizes: Sequence[int]) -> int:
    fitting = [s for s in sizes if s >= count]
    if not fitting:
        raise ValueError(f"{count} running requests exceed the largest graph batch size {max(sizes)}")
    return min(fitting)


def target_size(counts: Sequence[int], sizes: Sequence[int]) -> int | None:
    if not counts:
        return None
    mean = sum(counts) / len(counts)
    top = bucket(max(counts), sizes)
    fitting = [s for s in sizes if mean <= s < top]
    return min(fitting) if fitting else None


def calc_balancing_tasks(requests: Mapping[int, Sequence[str]], sizes: Sequence[int]) -> list[Task]:
    """requests: DP rank -> ids of its running requests (oldest first)."""
    counts = {r: len(ids) for r, ids in requests.items()}
    target = target_size(list(counts.values()), sizes)
    if target is None:
        return []
    surplus = {r: list(requests[r][target:]) for r in sorted(requests) if counts[r] > target}
    receivers = sorted((r for r in requests if counts[r] < target), key=lambda r: (-(target - counts[r]), r))
    donors = deque(surplus)  # round-robin over the ranks that still have surplus
    tasks: list[Task] = []
    for dst in receivers:
        capacity = target - counts[dst]
        while capacity and donors:
            src = donors.popleft()
            take = min(len(surplus[src]), capacity)
            moved, surplus[src] = surplus[src][:take], surplus[src][take:]
            tasks.append(Task(src, dst, tuple(moved)))
            capacity -= take
            if surplus[src]:
                donors.append(src)
    return tasks


def apply_tasks(requests: Mapping[int, Sequence[str]], tasks: Sequence[Task]) -> dict[int, list[str]]:
    out = {r: list(ids) for r, ids in requests.items()}
    for t in tasks:
        for rid in t.request_ids:
            out[t.src].remove(rid)
            out[t.dst].append(rid)
    return out
