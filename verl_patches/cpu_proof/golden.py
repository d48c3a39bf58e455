"""Golden-metrics check of a finished run against a stored baseline (issue 15 item 4).

    python -m verl_patches.cpu_proof.golden RUN_DIR --check-against BASELINE.json [--gate-step-time]
        [--up-to-step N] [--json]
    python -m verl_patches.cpu_proof.golden RUN_DIR RUN_DIR RUN_DIR [...] --write-baseline BASELINE.json

RUN_DIR is a launch log folder (``logs/<profile>-<time>-<role>-<host>/``). Metrics come from what the run
wrote there: TensorBoard scalars under ``tensorboard/`` (full precision), else the console step lines of
``trainer.log`` (``step:N - key:value``, three decimals); per-rank memory from ``rank_memory.jsonl``
(`rank_memory`), all read by the driver's `run_metrics`.

A baseline is recorded from at least `MIN_RUNS` runs of the same command (different seeds, or reruns), and
keeps bands that hold over all of them: the run-to-run spread of a healthy run is inside the band, a bug
(a learning rate of 0, a flipped advantage) is not. Compared, each with the tolerance stored in the baseline
(defaults in `DEFAULT_TOLERANCES`):

* reward curve (``critic/score/mean``): the run must have at least the baseline's steps (or the first
  ``--up-to-step`` of them); the mean over each window of ``reward_window`` steps may fall at most
  ``reward_abs`` below the lowest of the recorded runs' means of that window;
* per-rank memory: each rank's peak may exceed the largest recorded peak by at most ``memory_rel``
  (relative) plus ``memory_abs_gib``; the ranks must be the same;
* log-prob mismatch (``rollout_mismatch/*``, see `logprob_mismatch`): the largest per-step value may be
  at most ``mismatch_factor`` times the recorded runs' largest plus ``mismatch_abs``;
* policy drift (``actor/kl_loss``, the actor's KL to the frozen reference, i.e. how far training has moved
  the policy): the mean over each window of ``reward_window`` steps must reach at least ``drift_factor``
  times the lowest of the recorded runs' means of that window. A policy that never moves (a learning rate
  of 0, an update that never reaches the weights) fails in the first window, long before its reward falls
  behind; a policy that moves faster is reported, never a failure;
* validation (``val-core/deepscaler/reward/mean@1``, greedy, on held-out problems), when the recorded runs
  validated: at each recorded validation step the run's value may fall at most ``val_abs`` below the lowest
  recorded one, and its rise (last validation minus the first, the base model's at step 0) at most
  ``val_abs`` below the smallest recorded rise, so a run whose validation does not rise fails;
* graph-decode share (``rollout/graph_decode_token_share``, the share of the sampled tokens that came from
  TorchAir graph decode steps, the path A3 makes ~99 % of its tokens on; see `decode_share`), when the recorded
  runs logged it: every step's share may fall at most ``graph_share_abs`` below the lowest recorded step's, so a
  run whose tokens move to eager steps (a prefill budget, a response format, a DP sync) proves another path
  and fails;
* step time (median ``timing_s/step`` without the first step): always reported; a regression only with
  ``--gate-step-time``, when slower than ``1 + step_time_rel`` times the baseline.

Exit status: 0 no regression, 1 a regression (each named with metric, step window or rank), 2 bad input.
Higher reward, lower memory, smaller mismatch and faster steps are reported, never failures.

Fail closed: every comparison with NaN is false, so a non-finite value of a compared metric (by step) or
of a memory peak (by rank) is itself a regression; a baseline is validated before use (strict JSON without
NaN, finite numbers, tolerances within `TOLERANCE_RANGES`, integer steps) and refused in one line
otherwise; a baseline is recorded only from runs without non-finite values. Run files and baselines are
read only when they are regular files (a FIFO would block the check).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_json_atomically
from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.checkpoint.strict_json import StrictJsonError, loads_strict
from verl_patches.driver.run_metrics import (
    DRIFT_KEY,
    MAX_STEP,
    REWARD_KEY,
    STEP_TIME_KEY,
    VAL_KEY,
    RunInputError,
    RunMetrics,
    read_run,
)
from verl_patches.rollout.decode_share import SHARE as GRAPH_SHARE_KEY
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF, RATIO_DEV

SCHEMA = 2
MIN_RUNS = 3
MISMATCH_KEYS = (ABS_DIFF, RATIO_DEV)
DEFAULT_TOLERANCES = {
    "reward_window": 10,
    "reward_abs": 0.1,
    "memory_rel": 0.10,
    "memory_abs_gib": 0.05,
    "mismatch_factor": 2.0,
    "mismatch_abs": 1e-5,
    "step_time_rel": 0.25,
    "val_abs": 0.1,
    "drift_factor": 0.25,
    "graph_share_abs": 0.05,
}
# keys added after schema 2's first baselines: defaulted when absent
ADDED_TOLERANCES = ("val_abs", "drift_factor", "graph_share_abs")
EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 2
COMPARED_KEYS = (REWARD_KEY, DRIFT_KEY, VAL_KEY, STEP_TIME_KEY, GRAPH_SHARE_KEY, *MISMATCH_KEYS)
# What a tolerance may be: outside these a baseline could pass anything (a reward slack of 10, a factor of 1e9)
TOLERANCE_RANGES = {
    "reward_window": (1, 10_000),
    "reward_abs": (0.0, 1.0),
    "memory_rel": (0.0, 1.0),
    "memory_abs_gib": (0.0, 64.0),
    "mismatch_factor": (1.0, 100.0),
    "mismatch_abs": (0.0, 1.0),
    "step_time_rel": (0.0, 10.0),
    "val_abs": (0.0, 1.0),
    "drift_factor": (0.0, 1.0),
    "graph_share_abs": (0.0, 1.0),
}
MAX_BASELINE_BYTES = 64 << 20
# one error for a run folder or a baseline that cannot be read; the message names the file and key
GoldenInputError = RunInputError


@dataclass(frozen=True)
class Check:
    metric: str
    where: str
    status: str  # ok | regression | info
    message: str

    def line(self) -> str:
        return f"{self.status.upper():<10} {self.metric} [{self.where}]: {self.message}"


def non_finite(run: RunMetrics) -> list[Check]:
    """Every non-finite value of a compared metric (by step) and every non-finite memory peak (by rank): each
    is a regression, since a comparison with NaN is always false and would pass."""
    out = [
        Check(key, f"step {step}", "regression", f"non-finite value {value!r}")
        for step, row in sorted(run.steps.items())
        for key, value in sorted(row.items())
        if key in COMPARED_KEYS and not math.isfinite(value)
    ]
    out += [
        Check("memory", f"rank {r}", "regression", f"non-finite peak {v!r} GiB")
        for r, v in sorted(run.rank_peak_gib.items())
        if not math.isfinite(v)
    ]
    return out


# ---- baseline ------------------------------------------------------------------------------------


def _median_step_time(run: RunMetrics) -> float | None:
    times = [v for _, v in run.series(STEP_TIME_KEY)][1:]  # the first step includes warm-up
    return statistics.median(times) if times else None


def _window_means(series: dict[int, float], steps: list[int], w: int) -> list[float]:
    return [sum(series[s] for s in steps[i : i + w]) / len(steps[i : i + w]) for i in range(0, len(steps), w)]


def _window_bands(curves: list[dict[int, float]], w: int) -> tuple[list[int], list[dict[str, Any]]]:
    """The steps every run has, and per window of `w` of them each run's mean and the lowest (the floor)."""
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    per_run = [_window_means(c, steps, w) for c in curves]
    windows = [
        {
            "steps": [steps[i], steps[min(i + w, len(steps)) - 1]],
            "means": [m[k] for m in per_run],
            "floor": min(m[k] for m in per_run),
        }
        for k, i in enumerate(range(0, len(steps), w))
    ]
    return steps, windows


def _drift_bands(runs: list[RunMetrics], w: int) -> dict[str, Any] | None:
    """Window floors of the policy's KL to the reference (None when a recorded run did not log it)."""
    curves = [dict(r.series(DRIFT_KEY)) for r in runs]
    if not all(curves):
        return None
    steps, windows = _window_bands(curves, w)
    return {"key": DRIFT_KEY, "steps": steps, "windows": windows} if steps else None


def make_baseline(
    runs: list[RunMetrics], tolerances: dict[str, float] | None = None, note: str = "", min_runs: int = MIN_RUNS
) -> dict[str, Any]:
    """The baseline document of finished runs of one command (pure): bands that hold over all of them."""
    tol = {**DEFAULT_TOLERANCES, **(tolerances or {})}
    if len(runs) < min_runs:
        raise GoldenInputError(
            f"a baseline needs at least {min_runs} runs (seeds or reruns) to know the "
            f"run-to-run spread; got {len(runs)}"
        )
    curves = []
    for run in runs:
        bad = non_finite(run)
        if bad:
            raise GoldenInputError(
                f"the run ({run.source}) has {len(bad)} non-finite value(s), first {bad[0].metric} "
                f"[{bad[0].where}]: a baseline is recorded from healthy runs only"
            )
        reward = dict(run.series(REWARD_KEY))
        if not reward:
            raise GoldenInputError(f"the run ({run.source}) has no {REWARD_KEY}: nothing to use as a reward curve")
        curves.append(reward)
    w = int(tol["reward_window"])
    steps, windows = _window_bands(curves, w)
    ranks = sorted(set().union(*(r.rank_peak_gib for r in runs)))
    mismatch = {
        k: max(v for r in runs for _, v in r.series(k)) for k in MISMATCH_KEYS if any(r.series(k) for r in runs)
    }
    medians = [m for m in (_median_step_time(r) for r in runs) if m is not None]
    validation = _validation_bands([dict(r.series(VAL_KEY)) for r in runs])
    return {
        "schema": SCHEMA,
        "note": note,
        "sources": [r.source for r in runs],
        "tolerances": tol,
        "reward": {
            "key": REWARD_KEY,
            "steps": steps,
            "values": [sum(c[s] for c in curves) / len(curves) for s in steps],
            "windows": windows,
        },
        "rank_peak_gib": {str(k): max(r.rank_peak_gib.get(k, 0.0) for r in runs) for k in ranks},
        "mismatch_max": mismatch,
        "step_time_median_s": statistics.median(medians) if medians else None,
        "validation": validation,
        "drift": _drift_bands(runs, w),
        "graph_share": _graph_share_floor(runs),
    }


def _graph_share_floor(runs: list[RunMetrics]) -> dict[str, Any] | None:
    """The lowest step's graph-decode share over the recorded runs (None when one did not log it)."""
    series = [[v for _, v in r.series(GRAPH_SHARE_KEY)] for r in runs]
    if not all(series):
        return None
    return {"key": GRAPH_SHARE_KEY, "floor": min(min(s) for s in series), "steps": min(len(s) for s in series)}


def _validation_bands(curves: list[dict[int, float]]) -> dict[str, Any] | None:
    """Floors per validation step and of the rise, over the recorded runs (None when they did not validate)."""
    steps = sorted(set.intersection(*(set(c) for c in curves))) if curves else []
    if not steps:
        return None
    rises = [c[steps[-1]] - c[steps[0]] for c in curves]
    return {
        "key": VAL_KEY,
        "steps": steps,
        "values": [[c[s] for s in steps] for c in curves],
        "floors": [min(c[s] for c in curves) for s in steps],
        "rises": rises,
        "rise_floor": min(rises),
    }


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _step(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_STEP


def validate_baseline(doc: Any, where: str) -> dict[str, Any]:
    """The baseline, or GoldenInputError naming the key: finite numbers, tolerances in their ranges, steps
    as integers in order, every list as long as its partner."""

    def bad(key: str, why: str) -> GoldenInputError:
        return GoldenInputError(f"{where}: key {key!r} {why}")

    if not isinstance(doc, dict):
        raise GoldenInputError(f"{where}: not a JSON object")
    if doc.get("schema") != SCHEMA or isinstance(doc.get("schema"), bool):
        raise bad("schema", f"is {str(doc.get('schema'))[:40]!r}, expected {SCHEMA}")
    tol = doc.get("tolerances")
    if not isinstance(tol, dict):
        raise bad("tolerances", f"must be an object holding {sorted(DEFAULT_TOLERANCES)}")
    for key in ADDED_TOLERANCES:  # a baseline recorded before the key existed has no use for it
        tol.setdefault(key, DEFAULT_TOLERANCES[key])
    for key, (low, high) in TOLERANCE_RANGES.items():
        value = tol.get(key)
        if not _number(value) or not low <= value <= high:
            raise bad(f"tolerances.{key}", f"must be a number from {low} to {high}, got {str(value)[:40]!r}")
    if int(tol["reward_window"]) != tol["reward_window"]:
        raise bad("tolerances.reward_window", "must be a whole number of steps")
    rw = doc.get("reward")
    if (
        not isinstance(rw, dict)
        or not isinstance(rw.get("values"), list)
        or not isinstance(rw.get("steps"), list)
        or len(rw["values"]) != len(rw["steps"])
        or not rw["values"]
    ):
        raise bad("reward", "must hold equally long, non-empty 'steps' and 'values' lists")
    if not all(_step(x) for x in rw["steps"]) or rw["steps"] != sorted(set(rw["steps"])):
        raise bad("reward.steps", "must be increasing step numbers")
    if not all(_number(x) for x in rw["values"]):
        raise bad("reward.values", "must be finite numbers")
    _validate_windows(rw, "reward", bad)
    peaks = doc.get("rank_peak_gib")
    if not isinstance(peaks, dict) or any(
        not re.fullmatch(r"[0-9]{1,7}", str(k)) or not _number(v) or v < 0 for k, v in peaks.items()
    ):
        raise bad("rank_peak_gib", "must be an object {rank: GiB} of ranks and finite, non-negative numbers")
    mismatch = doc.get("mismatch_max")
    if not isinstance(mismatch, dict) or any(not _number(v) or v < 0 for v in mismatch.values()):
        raise bad("mismatch_max", "must be an object {metric: finite, non-negative number}")
    step_time = doc.get("step_time_median_s")
    if step_time is not None and (not _number(step_time) or step_time <= 0):
        raise bad("step_time_median_s", "must be null or a positive finite number")
    val = doc.get("validation")
    if val is not None and (
        not isinstance(val, dict)
        or not isinstance(val.get("steps"), list)
        or not isinstance(val.get("floors"), list)
        or len(val["steps"]) != len(val["floors"])
        or not val["steps"]
        or not all(_step(x) for x in val["steps"])
        or val["steps"] != sorted(set(val["steps"]))
        or not all(_number(x) for x in val["floors"])
        or not _number(val.get("rise_floor"))
    ):
        raise bad(
            "validation",
            "must be null or {'steps': [increasing ints], 'floors': [finite numbers] as long, "
            "'rise_floor': finite number}",
        )
    drift = doc.get("drift")
    if drift is not None:
        if (
            not isinstance(drift, dict)
            or not isinstance(drift.get("steps"), list)
            or not drift["steps"]
            or not all(_step(x) for x in drift["steps"])
            or drift["steps"] != sorted(set(drift["steps"]))
        ):
            raise bad("drift", "must be null or {'steps': [increasing ints], 'windows': [...]}")
        _validate_windows(drift, "drift", bad)
        if any(w["floor"] < 0 for w in drift["windows"]):
            raise bad("drift.windows", "has a negative floor: a KL is never below 0")
    share = doc.get("graph_share")
    if share is not None and (
        not isinstance(share, dict) or not _number(share.get("floor")) or not 0 <= share["floor"] <= 1
    ):
        raise bad("graph_share", "must be null or {'floor': a share from 0 to 1}")
    return doc


def _validate_windows(section: dict[str, Any], name: str, bad: Callable[[str, str], GoldenInputError]) -> None:
    windows = section.get("windows")
    if (
        not isinstance(windows, list)
        or not windows
        or any(
            not isinstance(x, dict)
            or not _number(x.get("floor"))
            or not (
                isinstance(x.get("steps"), list)
                and len(x["steps"]) == 2
                and all(_step(v) for v in x["steps"])
                and x["steps"][0] <= x["steps"][1]
            )
            for x in windows
        )
    ):
        raise bad(f"{name}.windows", "must be a non-empty list of {'steps': [first, last], 'floor': finite number}")
    if any(not any(w["steps"][0] <= s <= w["steps"][1] for s in section["steps"]) for w in windows):
        raise bad(f"{name}.windows", f"has a window with none of {name}.steps in it")


def load_baseline(path: Path) -> dict[str, Any]:
    try:
        data = read_regular_file(path, max_bytes=MAX_BASELINE_BYTES)
        doc = loads_strict(data, str(path))
    except FileRefused as e:
        raise GoldenInputError(f"cannot read the baseline: {e}") from None
    except StrictJsonError as e:
        raise GoldenInputError(str(e)) from None
    return validate_baseline(doc, str(path))


def write_baseline(doc: dict[str, Any], path: Path) -> None:
    """Atomically (a temp file beside the target, then rename), with the umask's mode; a document that
    would not load back (NaN, a bad tolerance) is refused before anything is written."""
    validate_baseline(json.loads(json.dumps(doc)), f"the baseline for {path}")
    write_json_atomically(Path(path), doc)


# ---- comparison (pure) ---------------------------------------------------------------------------


def _compare_windows(
    run: RunMetrics,
    key: str,
    section: dict[str, Any],
    up_to_step: int | None,
    limit_of: Callable[[float], float],
    judge: Callable[[float, float, float], str],
) -> list[Check]:
    """Each stored window (those that end by `up_to_step`): the run's mean over its steps against
    limit_of(floor); judge(mean, floor, limit) words the check. Missing steps are one regression."""
    windows = [x for x in section["windows"] if up_to_step is None or x["steps"][1] <= up_to_step]
    if not windows:
        return [
            Check(
                key,
                f"steps up to {up_to_step}",
                "regression",
                f"no baseline window ends by step {up_to_step}: nothing to compare",
            )
        ]
    want = [s for s in section["steps"] if s <= windows[-1]["steps"][1]]
    have = dict(run.series(key))
    missing = [s for s in want if s not in have]
    if missing:
        return [
            Check(
                key,
                f"steps {missing[0]}-{missing[-1]}",
                "regression",
                f"the run has no {key} for {len(missing)} of the baseline's {len(want)} steps",
            )
        ]
    out = []
    for x in windows:
        first, last = x["steps"]
        window = [s for s in want if first <= s <= last]
        mean = sum(have[s] for s in window) / len(window)
        floor = float(x["floor"])
        limit = limit_of(floor)
        out.append(
            Check(key, f"steps {first}-{last}", "ok" if mean >= limit else "regression", judge(mean, floor, limit))
        )
    return out


def compare_reward(run: RunMetrics, base: dict[str, Any], up_to_step: int | None = None) -> list[Check]:
    slack = float(base["tolerances"]["reward_abs"])

    def judge(mean: float, floor: float, limit: float) -> str:
        if mean < limit:
            return f"mean {mean:.4f} < lowest recorded {floor:.4f} - {slack}"
        return f"mean {mean:.4f} (lowest recorded {floor:.4f}, tolerance -{slack})"

    return _compare_windows(run, REWARD_KEY, base["reward"], up_to_step, lambda f: f - slack, judge)


def compare_drift(run: RunMetrics, base: dict[str, Any], up_to_step: int | None = None) -> list[Check]:
    drift = base.get("drift")
    if not drift:
        return [Check(DRIFT_KEY, "all steps", "info", "the baseline has no policy drift (KL to the reference)")]
    factor = float(base["tolerances"]["drift_factor"])

    def judge(mean: float, floor: float, limit: float) -> str:
        if mean < limit:
            return (
                f"mean {mean:.3g} < {factor} x lowest recorded {floor:.3g}: the policy moved away from the "
                "reference far less than in every recorded run (a learning rate of 0, an update that never "
                "reaches the weights)"
            )
        return f"mean {mean:.3g} (lowest recorded {floor:.3g}, at least {factor} x it)"

    return _compare_windows(run, DRIFT_KEY, drift, up_to_step, lambda f: f * factor, judge)


def compare_validation(run: RunMetrics, base: dict[str, Any], up_to_step: int | None = None) -> list[Check]:
    val = base.get("validation")
    if not val:
        return [Check(VAL_KEY, "all steps", "info", "the baseline has no validation")]
    slack = float(base["tolerances"]["val_abs"])
    pairs = [(s, float(f)) for s, f in zip(val["steps"], val["floors"]) if up_to_step is None or s <= up_to_step]
    have = dict(run.series(VAL_KEY))
    out = []
    for step, floor in pairs:
        if step not in have:
            out.append(Check(VAL_KEY, f"step {step}", "regression", "the run did not validate here (the baseline did)"))
        elif have[step] < floor - slack:
            out.append(
                Check(
                    VAL_KEY, f"step {step}", "regression", f"{have[step]:.4f} < lowest recorded {floor:.4f} - {slack}"
                )
            )
        else:
            out.append(
                Check(
                    VAL_KEY, f"step {step}", "ok", f"{have[step]:.4f} (lowest recorded {floor:.4f}, tolerance -{slack})"
                )
            )
    first, last = (pairs[0][0], pairs[-1][0]) if pairs else (None, None)
    if first is not None and last != first and first in have and last in have:
        rise, floor = have[last] - have[first], float(val["rise_floor"])
        where = f"rise, step {first} to {last}"
        if up_to_step is not None and last != val["steps"][-1]:
            floor = min(floor, 0.0)  # a partial run is only held to not falling: the recorded rise is over all steps
        status = "regression" if rise < floor - slack else "ok"
        out.append(
            Check(
                VAL_KEY,
                where,
                status,
                f"{rise:+.4f} ({'<' if status != 'ok' else '>='} smallest recorded {floor:+.4f} - {slack})",
            )
        )
    return out


def compare_memory(run: RunMetrics, base: dict[str, Any]) -> list[Check]:
    tol = base["tolerances"]
    want = {int(r): float(v) for r, v in base["rank_peak_gib"].items()}
    if not want:
        return [Check("memory", "all ranks", "info", "the baseline has no per-rank memory")]
    have = run.rank_peak_gib
    if not have:
        return [Check("memory", "all ranks", "regression", "the run wrote no per-rank memory (rank_memory.jsonl)")]
    out = []
    if set(have) != set(want):
        out.append(
            Check("memory", "ranks", "regression", f"ranks {sorted(have)} differ from the baseline's {sorted(want)}")
        )
    common = sorted(set(have) & set(want))
    for r in common:
        limit = want[r] * (1 + float(tol["memory_rel"])) + float(tol["memory_abs_gib"])
        if have[r] > limit:
            out.append(
                Check(
                    "memory",
                    f"rank {r}",
                    "regression",
                    f"peak {have[r]:.3f} GiB > {limit:.3f} (baseline {want[r]:.3f} GiB + "
                    f"{tol['memory_rel']:.0%} + {tol['memory_abs_gib']} GiB)",
                )
            )
    if common and not any(c.status == "regression" for c in out):
        worst = max(common, key=lambda r: have[r] - want[r])
        out.append(
            Check(
                "memory",
                f"{len(want)} ranks",
                "ok",
                f"largest growth on rank {worst}: {have[worst]:.3f} GiB vs baseline {want[worst]:.3f} GiB",
            )
        )
    return out


def compare_mismatch(run: RunMetrics, base: dict[str, Any]) -> list[Check]:
    tol = base["tolerances"]
    out = []
    for key, b in sorted(base["mismatch_max"].items()):
        series = run.series(key)
        if not series:
            out.append(Check(key, "all steps", "regression", "the run logged no value (the baseline has one)"))
            continue
        step, worst = max(series, key=lambda sv: sv[1])
        limit = float(b) * float(tol["mismatch_factor"]) + float(tol["mismatch_abs"])
        status = "regression" if worst > limit else "ok"
        out.append(
            Check(
                key,
                f"step {step}",
                status,
                f"max {worst:.3g} {'>' if status != 'ok' else '<='} {limit:.3g} (baseline max {float(b):.3g})",
            )
        )
    return out


def compare_graph_share(run: RunMetrics, base: dict[str, Any], up_to_step: int | None = None) -> list[Check]:
    share = base.get("graph_share")
    if not share:
        return [Check(GRAPH_SHARE_KEY, "all steps", "info", "the baseline has no graph-decode share")]
    series = [(s, v) for s, v in run.series(GRAPH_SHARE_KEY) if up_to_step is None or s <= up_to_step]
    if not series:
        return [
            Check(
                GRAPH_SHARE_KEY,
                "all steps",
                "regression",
                "the run logged no graph-decode share (the baseline has one): which path made its tokens is unknown",
            )
        ]
    floor, slack = float(share["floor"]), float(base["tolerances"]["graph_share_abs"])
    step, low = min(series, key=lambda sv: sv[1])
    status = "ok" if low >= floor - slack else "regression"
    why = "" if status == "ok" else ": more of the tokens came from eager steps, a path A3 barely takes"
    return [
        Check(
            GRAPH_SHARE_KEY,
            f"step {step}",
            status,
            f"lowest {low:.4f} {'>=' if status == 'ok' else '<'} lowest recorded {floor:.4f} - {slack}{why}",
        )
    ]


def compare_step_time(run: RunMetrics, base: dict[str, Any], gate: bool) -> list[Check]:
    b, c = base.get("step_time_median_s"), _median_step_time(run)
    if not b or c is None:
        return [Check(STEP_TIME_KEY, "median", "info", f"not compared (run {c}, baseline {b})")]
    ratio = c / float(b)
    limit = 1 + float(base["tolerances"]["step_time_rel"])
    status = "regression" if gate and ratio > limit else ("ok" if gate else "info")
    return [
        Check(
            STEP_TIME_KEY,
            "median",
            status,
            f"{c:.3f} s vs baseline {float(b):.3f} s ({ratio:.2f}x; "
            f"{'gated at' if gate else 'not gated, limit would be'} {limit:.2f}x)",
        )
    ]


def compare(
    run: RunMetrics, base: dict[str, Any], gate_step_time: bool = False, up_to_step: int | None = None
) -> list[Check]:
    return (
        non_finite(run)
        + compare_reward(run, base, up_to_step)
        + compare_drift(run, base, up_to_step)
        + compare_validation(run, base, up_to_step)
        + compare_memory(run, base)
        + compare_mismatch(run, base)
        + compare_graph_share(run, base, up_to_step)
        + compare_step_time(run, base, gate_step_time)
    )


# ---- command line --------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.cpu_proof.golden",
        description="Compare a finished run with a stored baseline, or write one.",
    )
    p.add_argument(
        "run_dir",
        type=Path,
        nargs="+",
        help="the run's log folder (tensorboard/, trainer.log, rank_memory.jsonl); to write a baseline, "
        f"at least {MIN_RUNS} runs of the same command",
    )
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--check-against", type=Path, metavar="BASELINE.json")
    g.add_argument("--write-baseline", type=Path, metavar="BASELINE.json")
    p.add_argument("--gate-step-time", action="store_true", help="a slower median step is a regression")
    p.add_argument("--note", default="", help="free text stored in a written baseline")
    p.add_argument(
        "--up-to-step",
        type=int,
        metavar="N",
        help="compare the reward and the policy drift only over the baseline's windows that end by step N, and "
        "the validation at its steps up to N (a shorter run)",
    )
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    try:
        runs = [read_run(d) for d in args.run_dir]
        if args.write_baseline:
            doc = make_baseline(runs, note=args.note)
            write_baseline(doc, args.write_baseline)
            print(
                f"golden: wrote {args.write_baseline} from {len(runs)} runs ({len(doc['reward']['values'])} steps, "
                f"{len(doc['rank_peak_gib'])} ranks)"
            )
            return EXIT_OK
        if len(runs) != 1:
            raise GoldenInputError(f"--check-against compares one run; got {len(runs)} run folders")
        run = runs[0]
        checks = compare(run, load_baseline(args.check_against), args.gate_step_time, args.up_to_step)
    except GoldenInputError as e:
        print(f"golden: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:  # a folder that cannot be listed, a baseline folder that cannot be written
        print(f"golden: {e.filename or ''}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    bad = [c for c in checks if c.status == "regression"]
    if args.json:
        print(json.dumps({"passed": not bad, "checks": [c.__dict__ for c in checks]}, indent=2))
    else:
        print("\n".join(c.line() for c in checks))
        print(f"golden: {'PASS' if not bad else 'REGRESSION'} ({len(bad)} regression(s), run {run.source})")
    return EXIT_REGRESSION if bad else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
