"""Benchmark the deepscaler converter on 40,000 synthetic rows (the real set has about 40k).

Side by side in one run: our `convert` (read with line tracking, validate every row, seeded split,
explicit schema, atomic writes) against a minimal baseline in the vendor's style (json.load, build
rows, pandas to_parquet, no validation, no shuffle). Goal (issue 3): the conversion completes in
seconds; the PASS line uses 10 s.  Usage: .venv/bin/python bench/bench_json_to_parquet.py [--rows N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pandas as pd  # noqa: E402

from verl_patches.data.convert import convert  # noqa: E402

GOAL_SECONDS = 10.0


def synthetic_rows(n: int, seed: int = 0) -> list[dict]:
    """Rows shaped like DeepScaleR: a LaTeX problem (~300 chars), a short answer, a long solution."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(2, 999), rng.randint(2, 999)
        problem = (
            f"Problem {i}: Let $f(x) = {a}x^2 + {b}x + \\frac{{{a}}}{{{b}}}$. Find the sum of all real $x$ such that "
            f"$f(x) = {a + b}$, and express your answer as a common fraction $\\frac{{m}}{{n}}$. "
            + "Justify each step. "
            * rng.randint(3, 8)
        )
        solution = (
            f"We set ${a}x^2 + {b}x + \\frac{{{a}}}{{{b}}} - {a + b} = 0$ and use Vieta's formulas. "
            * rng.randint(10, 20)
        ).strip()
        rows.append({"problem": problem, "answer": f"\\frac{{-{b}}}{{{a}}}", "solution": solution})
    return rows


def baseline(json_path: Path, out: Path, ratio: float) -> None:
    with open(json_path) as f:
        data = json.load(f)
    rows = [
        {
            "data_source": "deepscaler",
            "prompt": [{"role": "user", "content": d["problem"]}],
            "ability": "math",
            "reward_model": {"ground_truth": d["answer"], "style": "rule"},
            "extra_info": {"answer": d["solution"]},
        }
        for d in data
    ]
    cut = int(len(rows) * ratio)
    pd.DataFrame(rows[:cut]).to_parquet(out / "train.parquet")
    pd.DataFrame(rows[cut:]).to_parquet(out / "test.parquet")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=40_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        rows = synthetic_rows(args.rows)
        json_path = tmp_path / "deepscaler.json"
        json_path.write_text(json.dumps(rows, indent=2))
        jsonl_path = tmp_path / "deepscaler.jsonl"
        jsonl_path.write_text("\n".join(json.dumps(r) for r in rows))
        size_mb = json_path.stat().st_size / 1e6

        started = time.perf_counter()
        report = convert(json_path, tmp_path / "ours", progress=False)
        ours = time.perf_counter() - started
        started = time.perf_counter()
        convert(jsonl_path, tmp_path / "ours_jsonl", progress=False)
        ours_jsonl = time.perf_counter() - started
        (tmp_path / "base").mkdir()
        started = time.perf_counter()
        baseline(json_path, tmp_path / "base", 0.9)
        base = time.perf_counter() - started

    print(f"input: {args.rows} rows, {size_mb:.1f} MB of JSON")
    print(f"ours, JSON array:   {ours:6.2f} s  {args.rows / ours:9.0f} rows/s  ({report.summary().splitlines()[0]})")
    print(f"ours, JSON Lines:   {ours_jsonl:6.2f} s  {args.rows / ours_jsonl:9.0f} rows/s")
    print(f"vendor-style baseline (no validation, no shuffle): {base:6.2f} s  {args.rows / base:9.0f} rows/s")
    print(f"ratio ours/baseline: {ours / base:.2f}")
    slowest = max(ours, ours_jsonl)
    ok = slowest <= GOAL_SECONDS
    print(f"{'PASS' if ok else 'FAIL'}: {args.rows} rows converted in {slowest:.2f} s (goal <= {GOAL_SECONDS:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
