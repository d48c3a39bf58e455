"""Re-record the tiny run's golden baseline: README command 1 run several times with different seeds, then
one baseline whose bands hold over all of them (`golden.make_baseline`).

    python -m verl_patches.cpu_proof.golden_record [--runs 3] [--log-root logs/golden-record] \
        [--out verl_patches/trainer/config/ppo_tiny_local.baseline.json] [-- extra overrides]

Run i > 0 changes only where randomness enters (the data order and the rollout's sampling stream), never
the model or the data set: `data.seed=1+i` and `actor_rollout_ref.rollout.seed=i`; run 0 is the command as
README gives it. With `--same-command` every run is README command 1 as is: with the CPU kernels pinned
(base/cpu_numerics.py) its reruns are bit-identical, and the bands are the tolerances around that one
run (the stored baseline: at the tiny settings one of the two seeded variants stalls, and bands over it could
not tell a learning rate of 0 from a healthy run). With `--host-variants` the runs are README command 1 as is
twice (its reruns must be bit-identical: the tool refuses to record otherwise) and then once under each kernel
setting of `HOST_VARIANTS`, the floats another host computes when the pins do not hold there (MKL's AUTO branch:
an Intel host with AVX-512 or any non-Intel host under a named MKL branch; ATen's AVX-512 kernels), each building
its own base model as that host would; the bands then hold over the spread such floats cause, and the tool
prints that spread per reward window. Each run takes 5-20 minutes on a 2-core machine; progress is printed per
run. Nothing is written unless every run finished and the baseline could be made from them (then atomically).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from verl_patches.cpu_proof.golden import (
    COMPARED_KEYS,
    DEFAULT_TOLERANCES,
    MIN_RUNS,
    REWARD_KEY,
    STEP_TIME_KEY,
    GoldenInputError,
    make_baseline,
    read_run,
    write_baseline,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/train_deepseekv3_256die_random_init.sh"
DEFAULT_OUT = REPO_ROOT / "verl_patches/trainer/config/ppo_tiny_local.baseline.json"


# (label, environment) of the runs that stand for other hosts' floats (base/cpu_numerics.py says why they differ)
HOST_VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("MKL AUTO branch", {"MKL_CBWR": "AUTO"}),
    ("ATen AVX-512 kernels", {"ATEN_CPU_CAPABILITY": "avx512"}),
)


def host_variant_runs(log_root: Path) -> list[tuple[str, dict[str, str], list[str]]]:
    """(label, environment, overrides) of each run of --host-variants (pure): README command 1 twice, then one
    run per host variant with its own tiny assets (a host builds its own base model)."""
    runs: list[tuple[str, dict[str, str], list[str]]] = [("as is", {}, []), ("as is, again", {}, [])]
    for i, (label, env) in enumerate(HOST_VARIANTS):
        runs.append((label, dict(env), [f"overlay.tiny_assets_dir={log_root / f'assets-variant{i}'}"]))
    return runs


def window_spread(runs: list[Any], window: int) -> list[tuple[int, int, float]]:
    """(first step, last step, max - min of the runs' window means) of the reward, per window (pure)."""
    curves = [dict(r.series(REWARD_KEY)) for r in runs]
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    out = []
    for i in range(0, len(steps), window):
        part = steps[i : i + window]
        means = [sum(c[s] for s in part) / len(part) for c in curves]
        out.append((part[0], part[-1], max(means) - min(means)))
    return out


def identical_steps(a: Any, b: Any) -> str | None:
    """None when two runs logged the same value of every compared metric at every step, else the first
    difference (the pinned reruns must be bit-identical)."""
    for step in sorted(set(a.steps) | set(b.steps)):
        for key in COMPARED_KEYS:
            x, y = a.steps.get(step, {}).get(key), b.steps.get(step, {}).get(key)
            if key == STEP_TIME_KEY or x == y or (x is not None and y is not None and x != x and y != y):
                continue
            return f"step {step} {key}: {x!r} vs {y!r}"
    return None


def seed_overrides(i: int) -> list[str]:
    """The overrides of run i (pure): run 0 is README's command unchanged."""
    return [] if i == 0 else [f"data.seed={1 + i}", f"+actor_rollout_ref.rollout.seed={i}"]


def run_command(log_dir: Path, overrides: list[str]) -> list[str]:
    return ["bash", SCRIPT, "--tiny", "--log-dir", str(log_dir), "--", *overrides]


def _run_dir(log_dir: Path) -> Path:
    dirs = sorted(log_dir.glob("tiny-*-local-*"))
    if not dirs:
        raise GoldenInputError(f"{log_dir}: the run left no log folder")
    return dirs[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.cpu_proof.golden_record", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--runs", type=int, default=MIN_RUNS, help=f"how many runs (at least {MIN_RUNS})")
    p.add_argument("--log-root", type=Path, default=REPO_ROOT / "logs" / "golden-record")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--note", default="")
    p.add_argument("--same-command", action="store_true", help="every run is README command 1 as is (no seeds)")
    p.add_argument(
        "--host-variants",
        action="store_true",
        help="README command 1 twice (must be bit-identical), then once per other host's kernel setting",
    )
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = p.parse_args(argv)
    if args.runs < MIN_RUNS:
        print(f"golden_record: --runs must be at least {MIN_RUNS}", file=sys.stderr)
        return 2
    if args.host_variants:
        plan = [
            (label, env, overrides + list(args.overrides)) for label, env, overrides in host_variant_runs(args.log_root)
        ]
    else:
        plan = [
            ("", {}, ([] if args.same_command else seed_overrides(i)) + list(args.overrides)) for i in range(args.runs)
        ]
    run_dirs = []
    for i, (label, env, overrides) in enumerate(plan):
        log_dir = args.log_root / f"run{i}"
        what = ", ".join(x for x in (label, " ".join(f"{k}={v}" for k, v in env.items()), " ".join(overrides)) if x)
        print(f"golden_record: run {i + 1}/{len(plan)} ({what or 'README command 1'}), logs in {log_dir}", flush=True)
        start = time.monotonic()
        rc = subprocess.run(run_command(log_dir, overrides), cwd=REPO_ROOT, env={**os.environ, **env}).returncode
        if rc != 0:
            print(f"golden_record: run {i + 1} exited with status {rc}; nothing written", file=sys.stderr)
            return 1
        run_dirs.append(_run_dir(log_dir))
        print(f"golden_record: run {i + 1}/{len(plan)} done in {time.monotonic() - start:.0f} s", flush=True)
    try:
        runs = [read_run(d) for d in run_dirs]
        extra = f"; every run also {' '.join(args.overrides)}" if args.overrides else ""
        if args.host_variants:
            differs = identical_steps(runs[0], runs[1])
            if differs:
                raise GoldenInputError(f"the pinned reruns differ ({differs}): the pins do not hold on this host")
            spread = window_spread(runs, int(DEFAULT_TOLERANCES["reward_window"]))
            print(
                "golden_record: reward spread over the runs per window: "
                + ", ".join(f"{a}-{b}: {d:.3f}" for a, b, d in spread),
                flush=True,
            )
        note = args.note or (
            f"README command 1 as is twice (bit-identical), then once under each of "
            f"{', '.join(f'{label} ({env})' for label, env in HOST_VARIANTS)}, the floats of hosts where the pins "
            f"do not hold (each with its own base model){extra}"
            if args.host_variants
            else f"{args.runs} runs of README command 1 as is{extra}"
            if args.same_command
            else f"{args.runs} runs of README command 1; run i: data.seed=1+i and "
            f"actor_rollout_ref.rollout.seed=i (run 0 as README gives it){extra}"
        )
        doc = make_baseline(runs, note=note)
        write_baseline(doc, args.out)
    except GoldenInputError as e:
        print(f"golden_record: {e}", file=sys.stderr)
        return 2
    floors = ", ".join(f"{w['steps'][0]}-{w['steps'][1]}: {w['floor']:.3f}" for w in doc["reward"]["windows"])
    print(f"golden_record: wrote {args.out} from {len(runs)} runs; reward window floors {floors}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
