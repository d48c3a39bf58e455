"""Benchmark of setup_sources.sh: the warm path against a cold install from an exported cache, in one run.

  .venv/bin/python bench/bench_sources.py [--repeat N]

(a) warm: `--verify` and a no-op setup on a temporary copy of the populated repo root;
(b) cold: every PyPI-route component installed into an empty temporary root from a directory made by
    `--export-cache` (the export reads the user download cache, so it is offline once the artifacts have
    been downloaded once).
Goals (DESIGN §3, issue 7): warm path under 2 s, cold from cache under 60 s on these 2-core machines.
Nothing in the repo root is written: the lock is read in place, every folder written is temporary.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SETUP = REPO_ROOT / "setup_sources.sh"
LOCK = REPO_ROOT / "sources.lock"
PACKAGES = ["verl", "vllm", "vllm_ascend", "megatron", "mindspeed", "mindspeed_llm"]
PYPI_COMPONENTS = ["verl", "vllm", "vllm_ascend", "megatron"]
WARM_GOAL_S, COLD_GOAL_S = 2.0, 60.0


def run(*args: str | Path, ok=(0,)) -> float:
    """Wall time of one setup_sources.sh call; exits with its output if the status is unexpected."""
    cmd = ["bash", str(SETUP), "--lock", str(LOCK), *map(str, args)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in ok:
        sys.exit(f"bench_sources: `{' '.join(cmd)}` exited {proc.returncode}\n{proc.stdout}{proc.stderr}")
    return elapsed


def copy_populated_root(dest: Path) -> list[str]:
    present = [p for p in PACKAGES if (REPO_ROOT / p).is_dir()]
    if "verl" not in present:
        sys.exit("bench_sources: the repo root is not populated; run `bash setup_sources.sh` first")
    dest.mkdir(parents=True)
    if (REPO_ROOT / ".sources_state.json").exists():
        shutil.copyfile(REPO_ROOT / ".sources_state.json", dest / ".sources_state.json")
    for p in present:
        shutil.copytree(REPO_ROOT / p, dest / p, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    return present


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="warm runs per command (median is reported)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench_sources.") as tmp:
        tmp = Path(tmp)
        warm_root = tmp / "warm"
        present = copy_populated_root(warm_root)
        only = ["--only", *[c for c in PACKAGES if c in present]]
        # 3 = complete except components this host does not need (MindSpeed absent on a CPU machine)
        verify = statistics.median(run("--root", warm_root, "--verify", *only, ok=(0, 3)) for _ in range(args.repeat))
        noop = statistics.median(run("--root", warm_root, "--offline", *only, ok=(0, 3)) for _ in range(args.repeat))

        export_dir, cold_root = tmp / "export", tmp / "cold"
        export = run(
            "--root", tmp / "export-root", "--route", "pypi", "--export-cache", export_dir, "--only", *PYPI_COMPONENTS
        )
        cold = run(
            "--root", cold_root, "--route", "cache", "--cache", export_dir, "--offline", "--only", *PYPI_COMPONENTS
        )
        cold_verify = run("--root", cold_root, "--verify", "--only", *PYPI_COMPONENTS)

    warm = max(verify, noop)
    print(f"warm  --verify        ({len(present)} components, median of {args.repeat}): {verify:7.2f} s")
    print(f"warm  no-op setup     ({len(present)} components, median of {args.repeat}): {noop:7.2f} s")
    print(f"      --export-cache  ({len(PYPI_COMPONENTS)} PyPI components, from the download cache): {export:7.2f} s")
    print(
        f"cold  install from the exported cache into an empty root ({len(PYPI_COMPONENTS)} components): "
        f"{cold:7.2f} s  (its --verify: {cold_verify:.2f} s)"
    )
    print(f"ratio cold / warm = {cold / warm:.1f}x")
    warm_ok, cold_ok = warm < WARM_GOAL_S, cold < COLD_GOAL_S
    print(f"{'PASS' if warm_ok else 'FAIL'}: warm path {warm:.2f} s (goal < {WARM_GOAL_S:.0f} s)")
    print(f"{'PASS' if cold_ok else 'FAIL'}: cold install from cache {cold:.2f} s (goal < {COLD_GOAL_S:.0f} s)")
    return 0 if warm_ok and cold_ok else 1


if __name__ == "__main__":
    sys.exit(main())
