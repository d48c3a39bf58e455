"""Re-record the tiny run's golden baseline: README command 1 run several times with different seeds, then
one baseline whose bands hold over all of them (`golden.make_baseline`).

    python -m verl_patches.trainer.golden_record [--runs 3] [--log-root logs/golden-record] \
        [--out verl_patches/trainer/config/ppo_tiny_local.baseline.json] [-- extra overrides]

Run i > 0 changes only where randomness enters (the data order and the rollout's sampling stream), never
the model or the data set: `data.seed=1+i` and `actor_rollout_ref.rollout.seed=i`; run 0 is the command as
README gives it. With `--same-command` every run is README command 1 as is: with the CPU kernels pinned
(base/cpu_numerics.py) its reruns are bit-identical, and the bands are the tolerances around that one
run (the stored baseline: at the tiny settings one of the two seeded variants stalls, and bands over it could
not tell a learning rate of 0 from a healthy run). Each run takes 5-20 minutes on a 2-core machine; progress is
printed per run. Nothing is written unless every run finished and the baseline could be made from them (then
atomically).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from verl_patches.trainer.golden import MIN_RUNS, GoldenInputError, make_baseline, read_run, write_baseline

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/train_deepseekv3_256die_random_init.sh"
DEFAULT_OUT = REPO_ROOT / "verl_patches/trainer/config/ppo_tiny_local.baseline.json"


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
        prog="python -m verl_patches.trainer.golden_record", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--runs", type=int, default=MIN_RUNS, help=f"how many runs (at least {MIN_RUNS})")
    p.add_argument("--log-root", type=Path, default=REPO_ROOT / "logs" / "golden-record")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--note", default="")
    p.add_argument("--same-command", action="store_true", help="every run is README command 1 as is (no seeds)")
    p.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (after --)")
    args = p.parse_args(argv)
    if args.runs < MIN_RUNS:
        print(f"golden_record: --runs must be at least {MIN_RUNS}", file=sys.stderr)
        return 2
    run_dirs = []
    for i in range(args.runs):
        log_dir = args.log_root / f"run{i}"
        overrides = ([] if args.same_command else seed_overrides(i)) + list(args.overrides)
        print(
            f"golden_record: run {i + 1}/{args.runs} ({' '.join(overrides) or 'README command 1'}), logs in {log_dir}",
            flush=True,
        )
        start = time.monotonic()
        rc = subprocess.run(run_command(log_dir, overrides), cwd=REPO_ROOT).returncode
        if rc != 0:
            print(f"golden_record: run {i + 1} exited with status {rc}; nothing written", file=sys.stderr)
            return 1
        run_dirs.append(_run_dir(log_dir))
        print(f"golden_record: run {i + 1}/{args.runs} done in {time.monotonic() - start:.0f} s", flush=True)
    try:
        runs = [read_run(d) for d in run_dirs]
        extra = f"; every run also {' '.join(args.overrides)}" if args.overrides else ""
        note = args.note or (
            f"{args.runs} runs of README command 1 as is{extra}"
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
