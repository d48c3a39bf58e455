"""One compact line per training step, for a person watching the run (`step_line`).

verl's console logger prints every metric of a step on one line (~1.5 KB at A3, three decimals); the full
metrics go to TensorBoard at full precision. This line holds what tells whether the run is healthy and when it
ends, in about 200 characters:

    [step 12/70] ETA 14h30m (2h51m in) | 123 tok/s/card | reward 0.412 | val 0.503 | resp 1577 |
    mismatch 2.1e-03 | graph 99.1% | 860s: gen 374 (sync 11) ref 145 update 319 save 960 test 391

(one line in the log). A metric the step did not log is left out; one that is not finite is shown as ``nan``
or ``inf``, never hidden. The ETA is the median step time so far times the steps left, so one slow step (a
checkpoint save, a validation) does not swing it. The line never matches verl's console format
(``step:N - key:value``), which `run_metrics.parse_console` and the end-to-end tests read.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from verl_patches.rollout.decode_share import SHARE as GRAPH_SHARE_KEY
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF as MISMATCH_KEY

PREFIX = "[step "  # what `grep -F` finds in trainer.log
REWARD_KEY = "critic/score/mean"
RESPONSE_KEY = "response_length/mean"
# our step-metrics patch (patches/verl/trainer/metrics.py): all tokens of a step / step time / A3 cards
CARD_THROUGHPUT_KEY = "perf/system_tokens_per_s_per_card"
# verl's own: per worker process (one NPU die, one GPU), used when the per-card figure is absent
WORKER_THROUGHPUT_KEY = "perf/throughput"
STEP_TIME_KEY = "timing_s/step"
SYNC_KEY = "timing_s/reshard"  # the train -> rollout weight switch, part of timing_s/gen
# verl's validation metrics: val-core/<data source>/<reward or acc>/mean@<samples>
VAL_PATTERN = re.compile(r"val-core/(?P<source>[^/]+)/[^/]+/mean@\d+")
# a data source's name comes from the data: only these characters reach the line (no ':' or ' - ', so the line
# can never read as verl's console format)
UNSAFE_IN_NAME = re.compile(r"[^A-Za-z0-9_.+-]")
MAX_DAYS = 999  # a duration past it is shown as ">999d"
MAX_VAL_SOURCES = 3  # the rest are counted, not shown: the line stays one line
MAX_SOURCE_NAME = 24  # characters of a data source's name
# the longest line, every field at its widest (absurd values in exponent form, steps below 10**10); a real
# A3 step's line is under 200
MAX_LENGTH = 440
# (verl's timer name, the word on the line), in the order a step runs them
PHASES = (
    ("gen", "gen"),
    ("old_log_prob", "old_log_prob"),
    ("ref", "ref"),
    ("update_critic", "critic"),
    ("update_actor", "update"),
    ("testing", "test"),
    ("save_checkpoint", "save"),
)


def _number(value: Any) -> float | None:
    """The metric as a float; None for what is not a number (a string, a list)."""
    if isinstance(value, (str, bytes)):
        return None
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return None


def _not_finite(x: float) -> str | None:
    return None if math.isfinite(x) else ("nan" if math.isnan(x) else ("inf" if x > 0 else "-inf"))


def fmt_amount(x: float) -> str:
    """Seconds, tokens/s, lengths: about three significant digits, in exponent form only from ten million on
    (a value that large is a fault to see, not to read digit by digit)."""
    bad = _not_finite(x)
    if bad:
        return bad
    if abs(x) >= 1e7:
        return f"{x:.1e}"
    if abs(x) >= 99.5:
        return f"{x:.0f}"
    if abs(x) >= 9.95:
        return f"{x:.1f}"
    return f"{x:.2f}"


def fmt_duration(seconds: float) -> str:
    """``42s``, ``12m05s``, ``13h50m``, ``2d03h``."""
    bad = _not_finite(seconds)
    if bad:
        return bad
    if seconds >= MAX_DAYS * 86400:
        return f">{MAX_DAYS}d"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def eta_seconds(step: int, total: int, step_times: Sequence[float]) -> float | None:
    """The median of the finite step times so far times the steps left; None without a finite time."""
    times = [t for t in step_times if math.isfinite(t) and t >= 0]
    if not times or total <= 0:
        return None
    return statistics.median(times) * max(total - step, 0)


def _validation(metrics: Mapping[str, Any]) -> str | None:
    found: dict[str, float] = {}
    for key in sorted(metrics):
        m = VAL_PATTERN.fullmatch(str(key))
        value = _number(metrics[key]) if m else None
        if m and value is not None:
            found.setdefault(UNSAFE_IN_NAME.sub("_", m.group("source"))[:MAX_SOURCE_NAME], value)
    if not found:
        return None
    if len(found) == 1:
        return f"val {_fraction(next(iter(found.values())))}"
    shown = list(found.items())[:MAX_VAL_SOURCES]
    more = f" +{len(found) - len(shown)} more" if len(found) > len(shown) else ""
    return "val " + " ".join(f"{source} {_fraction(v)}" for source, v in shown) + more


def _fraction(x: float) -> str:
    """A reward or an accuracy (0..1) with three decimals; a value far outside shows in exponent form."""
    return _not_finite(x) or (f"{x:.3f}" if abs(x) < 1e6 else f"{x:.2e}")


def _phases(metrics: Mapping[str, Any]) -> str | None:
    parts = []
    for name, word in PHASES:
        t = _number(metrics.get(f"timing_s/{name}"))
        if t is None:
            continue
        part = f"{word} {fmt_amount(t)}"
        sync = _number(metrics.get(SYNC_KEY)) if name == "gen" else None
        if sync is not None:
            part += f" (sync {fmt_amount(sync)})"
        parts.append(part)
    step = _number(metrics.get(STEP_TIME_KEY))
    head = f"{fmt_amount(step)}s" if step is not None else ""
    if not parts:
        return head or None
    return f"{head}: {' '.join(parts)}" if head else " ".join(parts)


def step_line(metrics: Mapping[str, Any], step: int, total: int, step_times: Sequence[float], elapsed_s: float) -> str:
    """The line for `step` of `total` (pure): `metrics` are the step's as logged to the trackers, `step_times`
    the durations of the steps this process ran so far (this one included), `elapsed_s` the wall time since
    training started."""
    head = f"{PREFIX}{step}/{total}]" if total > 0 else f"{PREFIX}{step}]"
    eta = eta_seconds(step, total, step_times)
    fields = [head + (f" ETA {fmt_duration(eta)} ({fmt_duration(elapsed_s)} in)" if eta is not None else "")]
    card, worker = _number(metrics.get(CARD_THROUGHPUT_KEY)), _number(metrics.get(WORKER_THROUGHPUT_KEY))
    if card is not None:
        fields.append(f"{fmt_amount(card)} tok/s/card")
    elif worker is not None:
        fields.append(f"{fmt_amount(worker)} tok/s/worker")
    reward = _number(metrics.get(REWARD_KEY))
    if reward is not None:
        fields.append(f"reward {_fraction(reward)}")
    val = _validation(metrics)
    if val:
        fields.append(val)
    length = _number(metrics.get(RESPONSE_KEY))
    if length is not None:
        fields.append(f"resp {fmt_amount(length)}")
    mismatch = _number(metrics.get(MISMATCH_KEY))
    if mismatch is not None:
        fields.append(f"mismatch {_not_finite(mismatch) or f'{mismatch:.1e}'}")
    share = _number(metrics.get(GRAPH_SHARE_KEY))
    if share is not None:
        percent = _not_finite(share) or (f"{100 * share:.1f}%" if abs(share) < 1e4 else f"{100 * share:.2e}%")
        fields.append(f"graph {percent}")
    phases = _phases(metrics)
    if phases:
        fields.append(phases)
    return " | ".join(fields)
