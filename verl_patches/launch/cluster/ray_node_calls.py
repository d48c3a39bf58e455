"""Run one small function on every node of the job's Ray cluster, once each, from the head.

The launcher reaches the nodes through the Ray cluster it has just formed (every node's launch joined it): a
zero-CPU task pinned to each alive node (``NodeAffinitySchedulingStrategy``, not soft) runs the function
there. Used by the launch for what only every node can answer (`storage_probe`: is the checkpoint folder the
same storage everywhere). Each call waits a bounded time: a node stuck on a hung mount is reported by name,
never waited on forever.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

CALL_TIMEOUT_S = 180.0


def node_label(node: Mapping[str, Any]) -> str:
    """How a node is named in messages: its address and host name, as the hang report names them."""
    return f"{node.get('NodeManagerAddress', '?')} ({node.get('NodeManagerHostname', '?')})"


@contextlib.contextmanager
def cluster_nodes(
    address: str, fn: Callable[[str, Mapping[str, Any]], dict[str, Any]], timeout_s: float = CALL_TIMEOUT_S
) -> Iterator[tuple[list[str], Callable[[str, Mapping[int, Mapping[str, Any]]], dict[int, dict[str, Any]]]]]:
    """Connect to the cluster at ``address``; yield (node labels, call) where ``call(step, {index: kwargs})``
    runs ``fn(step, kwargs)`` on the node of each index, all at once, and returns {index: result} (a result
    ``{"error": ...}`` for a node that failed or did not answer within ``timeout_s``). Disconnects after."""
    # lazy: Ray is imported only where this talks to Ray; other users of this module do without it
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    started = not ray.is_initialized()
    if started:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        alive = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: str(n.get("NodeManagerAddress")))
        remote = ray.remote(num_cpus=0, max_retries=0)(fn)

        def call(step: str, kwargs_by_node: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
            refs = {
                i: remote.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(alive[i]["NodeID"], soft=False)
                ).remote(step, dict(kwargs))
                for i, kwargs in kwargs_by_node.items()
            }
            deadline = time.monotonic() + timeout_s
            out: dict[int, dict[str, Any]] = {}
            for i, ref in refs.items():
                try:
                    out[i] = ray.get(ref, timeout=max(1.0, deadline - time.monotonic()))
                except ray.exceptions.GetTimeoutError:
                    ray.cancel(ref, force=True)
                    out[i] = {"error": f"no answer within {timeout_s:.0f} s (a hung mount?)"}
                except ray.exceptions.RayError as err:
                    out[i] = {"error": str(err).strip().splitlines()[-1][:300] if str(err).strip() else repr(err)}
            return out

        yield [node_label(n) for n in alive], call
    finally:
        if started:
            ray.shutdown()


__all__ = ["CALL_TIMEOUT_S", "cluster_nodes", "node_label"]
