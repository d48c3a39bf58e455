"""A warning and a stop threshold on the per-step rollout/training log-prob mismatch (``rollout_mismatch/*``).

The rollout engine samples with its own numerics (A3: vllm-ascend in bf16) and the update trains on those
samples; `logprob_mismatch` measures the gap every step. Its size in a healthy bf16 run is known
(bench/bench_bf16_mismatch.py, docs/a3-cluster-guide.md "is my run healthy"); a gap well beyond it means the
two engines no longer compute the same model (a weight sync that loaded the wrong tensors, a kernel or routing
regression, a dtype mix-up), and every update from then on trains on samples of another policy.

Config (``overlay.rollout_mismatch_gate``; absent or null: no gate)::

    rollout_mismatch_gate:
      warn: {logprob_abs_diff_mean: 0.1, ...}   # a metric of `logprob_mismatch` (without its prefix) -> bound
      stop: {logprob_abs_diff_mean: 0.3, ...}   # null or absent: that metric is not gated at that level

A value above a ``warn`` bound logs one warning line for that step naming each metric crossed, its value,
bound and key; above a ``stop`` bound the run ends after the step is logged, with one line naming the same.
A non-finite value crosses every bound of its metric. `decide` is pure; `thresholds_from_config` is the one
reader of the keys, used by the config checks (and so by the preflight) and by the fit loop alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_patches.base.overlay_settings import OverlaySettingError, overlay_settings
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF, ABS_DIFF_MAX, PREFIX, RATIO_DEV

GATE_KEY = "overlay.rollout_mismatch_gate"
LEVELS = ("warn", "stop")
GATED = (ABS_DIFF, RATIO_DEV, ABS_DIFF_MAX)  # rollout_mismatch/tokens is a count, not a gap
OK, WARN, STOP = "ok", "warn", "stop"


class GateConfigError(ValueError):
    """A gate setting that is not a threshold; the message names the key."""


class RolloutMismatchStop(RuntimeError):
    """A rollout_mismatch metric crossed its stop threshold; the message is the one-line reason."""


@dataclass(frozen=True)
class Thresholds:
    warn: Mapping[str, float] = field(default_factory=dict)  # full metric name -> bound
    stop: Mapping[str, float] = field(default_factory=dict)

    def of(self, level: str) -> Mapping[str, float]:
        return self.warn if level == WARN else self.stop


@dataclass(frozen=True)
class Crossing:
    metric: str
    value: float
    bound: float
    level: str

    def describe(self) -> str:
        return f"{self.metric}={self.value:.4g} > {self.bound:g} ({threshold_key(self.level, self.metric)})"


@dataclass(frozen=True)
class Verdict:
    action: str  # OK, WARN or STOP
    crossings: tuple[Crossing, ...] = ()  # those of the action's level

    def line(self, step: int) -> str:
        what = "stopping the run" if self.action == STOP else "warning"
        return f"verl_patches rollout mismatch {what} at step {step}: " + "; ".join(
            c.describe() for c in self.crossings
        )


def threshold_key(level: str, metric: str) -> str:
    """The config key of `metric`'s bound at `level`: overlay.rollout_mismatch_gate.<level>.<name>."""
    return f"{GATE_KEY}.{level}.{metric[len(PREFIX) :] if metric.startswith(PREFIX) else metric}"


def _bound(level: str, name: str, value: Any) -> float | None:
    key = f"{GATE_KEY}.{level}.{name}"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise GateConfigError(f"{key}={value!r} must be a positive finite number (or null: not gated)")
    return float(value)


def thresholds_from_config(cfg: Any) -> Thresholds:
    """The gate's bounds from a composed config; `GateConfigError` names the first bad key."""
    try:
        section = overlay_settings(cfg).rollout_mismatch_gate  # a mapping or None, or refused naming the key
    except OverlaySettingError as err:
        raise GateConfigError(str(err)) from None
    if section is None:
        return Thresholds()
    unknown = [str(k) for k in section if k not in LEVELS]
    if unknown:
        raise GateConfigError(f"{GATE_KEY}.{unknown[0]}: unknown level; the gate has {' and '.join(LEVELS)}")
    names = [m[len(PREFIX) :] for m in GATED]
    levels: dict[str, dict[str, float]] = {}
    for level in LEVELS:
        bounds = section.get(level)
        levels[level] = {}
        if bounds is None:
            continue
        if not hasattr(bounds, "items"):
            raise GateConfigError(f"{GATE_KEY}.{level}={bounds!r} must map metric names ({', '.join(names)}) to bounds")
        for name, value in bounds.items():
            if name not in names:
                raise GateConfigError(f"{GATE_KEY}.{level}.{name}: not a gated metric (choose from {', '.join(names)})")
            bound = _bound(level, str(name), value)
            if bound is not None:
                levels[level][PREFIX + str(name)] = bound
    for metric, stop in levels[STOP].items():
        warn = levels[WARN].get(metric)
        if warn is not None and warn > stop:
            raise GateConfigError(
                f"{threshold_key(WARN, metric)}={warn:g} is above {threshold_key(STOP, metric)}={stop:g}: "
                "the run would stop before it warned"
            )
    return Thresholds(warn=levels[WARN], stop=levels[STOP])


def _crossed(value: Any, bound: float) -> bool:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return False
    return not math.isfinite(v) or v > bound


def decide(metrics: Mapping[str, Any], thresholds: Thresholds) -> Verdict:
    """STOP if any metric is above its stop bound, else WARN if any is above its warning bound, else OK; the
    verdict carries the crossings of its level. A metric absent from `metrics` is not judged."""
    for level in (STOP, WARN):
        crossings = tuple(
            Crossing(metric, float(metrics[metric]), bound, level)
            for metric, bound in thresholds.of(level).items()
            if metric in metrics and _crossed(metrics[metric], bound)
        )
        if crossings:
            return Verdict(level, crossings)
    return Verdict(OK)


def enforce(verdict: Verdict, step: int, say: Callable[[str], None]) -> None:
    """Say the verdict's line (nothing when OK); on STOP raise `RolloutMismatchStop` with that line."""
    if verdict.action == OK:
        return
    line = verdict.line(step)
    say(line)
    if verdict.action == STOP:
        raise RolloutMismatchStop(line)
