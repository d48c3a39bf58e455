"""`python -m verl_patches.trainer.cluster_check`: the trainer entry's way into a running Ray cluster, without training.

Submit it the way the trainer is submitted (``ray job submit ... -- python3 -m verl_patches.trainer.cluster_check``),
or run it on a node with RAY_ADDRESS set. It activates the prelude as the trainer entry does, joins the cluster
with the trainer's own arguments (`patching.ray_runtime.ray_init_kwargs`: RAY_ADDRESS, our runtime env, merged
with the job's), and runs one task on every live node, each saying whether our patches are active in that
worker (they get there only through the runtime env's setup hook: this module never imports the prelude at
import time). It never starts a Ray of its own and never stops the cluster: it only disconnects.

Exit 0 when the driver and a worker on every live node have the prelude active, 1 when one has not, 2 without
RAY_ADDRESS (nothing to join) or when the job's runtime env would keep the prelude from the workers.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from typing import Any

from verl_patches.device import device_kind
from verl_patches.patching.ray_runtime import RuntimeEnvConflict, ray_init_kwargs


def prelude_state() -> dict[str, Any]:
    """This process's overlay, as data: active or not, and its patch counts (run in the driver and in each worker)."""
    from verl_patches.patching.registry import get_registry  # lazy: what the worker's setup hook left, nothing more

    registry = get_registry()
    counts: dict[str, int] = {}
    for record in registry.records if registry is not None else []:
        counts[record.status] = counts.get(record.status, 0) + 1
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "active": bool(registry is not None and registry.active),
        "counts": counts,
    }


def describe(state: dict[str, Any]) -> str:
    counts = ", ".join(f"{n} {s}" for s, n in sorted(state["counts"].items()))
    status = "prelude active" if state["active"] else "prelude NOT active"
    return f"pid {state['pid']} on {state['host']}: {status}" + (f" ({counts})" if counts else "")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.trainer.cluster_check",
        description="Join the running Ray cluster as the trainer entry does (RAY_ADDRESS; under `ray job submit`, "
        "the job's) and check that our patches are active in this driver and in a worker on every node.",
    )
    p.add_argument("--timeout-s", type=float, default=300.0, help="how long the workers may take (default 300)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not os.environ.get("RAY_ADDRESS"):
        print(
            "cluster_check: RAY_ADDRESS is not set: submit this with `ray job submit` (which sets it) or set it to the "
            "cluster's address; this check never starts a Ray of its own",
            file=sys.stderr,
        )
        return 2
    import verl_patches.prelude_patch  # noqa: F401  (activates our patches in the driver, as the trainer entry does)

    # isort: split
    # lazy: Ray is imported only once there is a cluster to join
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        kwargs = ray_init_kwargs(None, device_kind())
    except RuntimeEnvConflict as e:
        print(f"cluster_check: {e}", file=sys.stderr)
        return 2
    driver = prelude_state()
    print(f"cluster_check: driver {describe(driver)}; joining {kwargs['address']}", flush=True)
    ray.init(**kwargs, logging_level="ERROR")
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        probe = ray.remote(num_cpus=0)(prelude_state)
        refs = {
            n["NodeManagerAddress"]: probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in nodes
        }
        states = dict(zip(refs, ray.get(list(refs.values()), timeout=args.timeout_s)))
    finally:
        ray.shutdown()  # disconnects this driver; the cluster stays as it was
    for address, state in sorted(states.items()):
        print(f"cluster_check: node {address}: worker {describe(state)}", flush=True)
    bad = [a for a, s in states.items() if not s["active"]]
    if not driver["active"] or bad or not states:
        where = ", ".join(["the driver"] * (not driver["active"]) + [f"node {a}" for a in sorted(bad)]) or "no node"
        print(f"cluster_check: FAIL: the prelude is not active in {where}", flush=True)
        return 1
    print(
        f"cluster_check: PASS: the prelude is active in the driver and in a worker on each of {len(states)} node(s)",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
