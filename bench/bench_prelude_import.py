"""Benchmark: what importing verl_patches.prelude_patch costs on top of importing the modules it patches.

  .venv/bin/python bench/bench_prelude_import.py [--repeat N]

Every measurement runs in a fresh interpreter (imports are cached per process), N times; medians are
reported. The targets are the modules the prelude patches or needs (torch, einops, FSDP, transformers'
modeling_utils, verl.utils.device, verl's Ray worker group, FSDP workers and main_ppo); they are what a
worker imports anyway. megatron_workers is not among them: it cannot import without the prelude (G1).

  after   import the targets, then time `import verl_patches.prelude_patch`: the prelude's own cost
          when everything it patches is loaded (catalog, fingerprints, applying, rebinding scans).
  first   import torch/einops, time the prelude, then time the other targets while counting the time
          spent inside our import hook (applying pending patches, rebinding): the Ray-worker order.
  alone   the same imports with no prelude at all, for the end-to-end difference (noisy: seconds of
          import time on a shared 2-core machine; reported, not judged).

Goal (issue 2): under 0.1 s on top of importing the targets themselves; judged on `after` and on
`first` (prelude + time inside the hook), whichever is larger. Garbage-collector pauses are timed
apart (gc.callbacks): once torch and transformers are loaded, the first few thousand allocations by
any code trigger a full collection of their heap (the `control` line shows plain code paying it), so
that pause belongs to the targets; both figures are printed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 0.1
BASE = ["torch", "einops"]
TARGETS = [
    "torch.distributed.fsdp",
    "transformers.modeling_utils",
    "verl.utils.device",
    "verl.single_controller.ray.base",
    "verl.workers.fsdp_workers",
    "verl.trainer.main_ppo",
]

CHILD = textwrap.dedent("""
    import gc, importlib, json, sys, time
    mode, base, targets = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(",")
    out = {}
    # Collector pauses, timed separately: after torch and transformers load, the heap is large and the
    # next few thousand allocations by *any* code trigger a full collection that those imports owe.
    gc_time, gc_start, inside = [0.0, 0.0], [0.0], [0]  # inside: nesting depth of our hook
    def on_gc(phase, info):
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            elapsed = time.perf_counter() - gc_start[0]
            gc_time[0] += elapsed
            if inside[0] > 0:
                gc_time[1] += elapsed
    gc.callbacks.append(on_gc)

    def timed(key, names):
        g, t = gc_time[0], time.perf_counter()
        for n in names:
            importlib.import_module(n)
        out[key] = time.perf_counter() - t
        out[key + "_gc"] = gc_time[0] - g

    timed("base", base)
    if mode == "after":
        timed("targets", targets)
        timed("prelude", ["verl_patches.prelude_patch"])
    elif mode == "first":
        from verl_patches.patching import import_hook, registry
        in_hook = [0.0]
        def counted(fn):
            def inner(*a, **k):
                inside[0] += 1
                t = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    inside[0] -= 1
                    if inside[0] == 0:  # nested calls (an import made by a patch factory) count once
                        in_hook[0] += time.perf_counter() - t
            return inner
        # Our share of every import: the pending check on each module name, and the apply/rebind pass
        # after a watched module loads (not the delegated find_spec of the real finder, which runs anyway).
        registry.Registry._has_pending = counted(registry.Registry._has_pending)
        registry.Registry._on_module_loaded = counted(registry.Registry._on_module_loaded)
        timed("prelude", ["verl_patches.prelude_patch"])
        timed("targets", targets)
        out["in_hook"], out["in_hook_gc"] = in_hook[0], gc_time[1]
        out["statuses"] = sorted({r.status for r in registry.get_registry().records})
    else:
        timed("targets", targets)
        # The same debt, paid by code that is not ours: a burst of 20k container allocations.
        g, t = gc_time[0], time.perf_counter()
        junk = [[] for _ in range(20000)]
        out["burst"], out["burst_gc"] = time.perf_counter() - t, gc_time[0] - g
    print(json.dumps(out))
""")


def run_child(mode: str) -> dict:
    env = dict(
        os.environ,
        VERL_PATCHES_QUIET="1",
        PYTHONWARNINGS="ignore",
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    )
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, mode, ",".join(BASE), ",".join(TARGETS)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"bench_prelude_import: the {mode!r} child failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median(runs: list[dict], key) -> float:
    return statistics.median(key(r) for r in runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5, help="fresh interpreters per mode (median is reported)")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")

    runs: dict[str, list[dict]] = {"after": [], "first": [], "alone": []}
    for i in range(args.repeat):  # interleaved, so that machine load drifts over all modes alike
        for mode in runs:
            runs[mode].append(run_child(mode))
            print(f"  run {i + 1}/{args.repeat} {mode:<5} {json.dumps(runs[mode][-1])}", file=sys.stderr, flush=True)

    after_raw = median(runs["after"], lambda r: r["prelude"])
    after_gc = median(runs["after"], lambda r: r["prelude_gc"])
    after_own = median(runs["after"], lambda r: r["prelude"] - r["prelude_gc"])
    first_prelude = median(runs["first"], lambda r: r["prelude"] - r["prelude_gc"])
    first_raw = median(runs["first"], lambda r: r["prelude"] + r["in_hook"])
    first_gc = median(runs["first"], lambda r: r["prelude_gc"] + r["in_hook_gc"])
    first_own = median(runs["first"], lambda r: r["prelude"] - r["prelude_gc"] + r["in_hook"] - r["in_hook_gc"])
    targets_alone = median(runs["alone"], lambda r: r["base"] + r["targets"])
    burst = median(runs["alone"], lambda r: r["burst"])
    burst_gc = median(runs["alone"], lambda r: r["burst_gc"])
    first_total = median(runs["first"], lambda r: r["base"] + r["prelude"] + r["targets"])
    after_total = median(runs["after"], lambda r: r["base"] + r["targets"] + r["prelude"])
    ms = 1000.0

    print(f"bench_prelude_import: medians of {args.repeat} fresh interpreters per mode (device=cpu)")
    print(f"  targets alone (no prelude)                          {targets_alone:7.3f} s")
    print(
        f"  after:  prelude imported after the targets          {after_raw * ms:7.1f} ms wall, "
        f"of which collector pauses {after_gc * ms:.1f} ms -> own {after_own * ms:.1f} ms"
    )
    print(
        f"  first:  prelude, then the targets (Ray-worker order) {first_raw * ms:6.1f} ms wall in the prelude "
        f"and our hook, of which collector pauses {first_gc * ms:.1f} ms -> own {first_own * ms:.1f} ms "
        f"(prelude itself {first_prelude * ms:.1f} ms)"
    )
    print(
        f"  control: 20k list allocations by other code right after the targets: {burst * ms:.1f} ms, "
        f"of which collector pauses {burst_gc * ms:.1f} ms (the imports' garbage, paid by whoever allocates next)"
    )
    print(
        f"  end to end (noisy): first {first_total:.3f} s, after {after_total:.3f} s vs alone {targets_alone:.3f} s "
        f"-> {first_total - targets_alone:+.3f} s / {after_total - targets_alone:+.3f} s"
    )
    print(f"  statuses seen in 'first': {runs['first'][0]['statuses']}")
    worst = max(after_own, first_own)
    verdict = "PASS" if worst < GOAL_S else "FAIL"
    print(
        f"{verdict}: prelude costs {worst * ms:.0f} ms on top of importing its targets, collector pauses owed "
        f"by the targets excluded (goal < {GOAL_S * ms:.0f} ms; with them: "
        f"{max(after_raw, first_raw) * ms:.0f} ms)"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
