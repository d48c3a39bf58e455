"""A finished run's logged metrics, read back from its run folder: what the driver's step wrote there.

Step metrics come from TensorBoard's scalars under ``tensorboard/`` (full precision), else from the console step
lines of ``trainer.log`` (``step:N - key:value``, three decimals, `STEP_LINE`); per-rank peak memory from
``rank_memory.jsonl`` (`rank_memory`). Read by the curves (`plot`), the CPU proof's golden check and the launch's
failure diagnosis. Run files are read only when they are regular files (a FIFO would block the reader), each
with a size bound; a file that cannot be read is one `RunInputError` naming it.
"""

from __future__ import annotations

import json
import math
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.driver.rank_memory import FILE_NAME

REWARD_KEY = "critic/score/mean"
VAL_KEY = "val-core/deepscaler/reward/mean@1"
STEP_TIME_KEY = "timing_s/step"
DRIFT_KEY = "actor/kl_loss"
STEP_LINE = re.compile(r"step:(\d+) - (.*)")
MAX_LOG_BYTES = 1 << 30  # trainer.log, rank_memory.jsonl
MAX_STEP = 10**9


class RunInputError(ValueError):
    """A run folder or file that cannot be read; the message names the file and key."""


@dataclass
class RunMetrics:
    steps: dict[int, dict[str, float]]
    rank_peak_gib: dict[int, float] = field(default_factory=dict)  # each rank's largest peak over the run
    source: str = ""

    def series(self, key: str) -> list[tuple[int, float]]:
        return [(s, m[key]) for s, m in sorted(self.steps.items()) if key in m]


def _regular(path: Path) -> None:
    """Run files are read only when they are regular files (a FIFO would block the reader for ever)."""
    try:
        mode = path.lstat().st_mode
    except OSError as e:
        raise RunInputError(f"{path}: cannot read ({e.strerror or e})") from None
    if not stat.S_ISREG(mode):
        raise RunInputError(f"{path}: not a regular file")


def read_tensorboard(folder: Path) -> dict[int, dict[str, float]]:
    # lazy: tensorboard is heavy and only this path needs it; importing this module stays light
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    steps: dict[int, dict[str, float]] = {}
    files = sorted(folder.rglob("events.out.tfevents.*"), key=lambda p: p.lstat().st_mtime)
    for events in files:
        _regular(events)
        try:
            acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
            acc.Reload()
            scalars = [(tag, acc.Scalars(tag)) for tag in acc.Tags().get("scalars", [])]
        except Exception as e:  # noqa: BLE001 - a damaged event file raises many types; one line names it
            raise RunInputError(f"{events}: not a readable TensorBoard event file ({type(e).__name__})") from None
        for tag, events_of_tag in scalars:
            for ev in events_of_tag:
                if not 0 <= int(ev.step) <= MAX_STEP:
                    raise RunInputError(f"{events}: {tag} has step {ev.step}, outside 0..{MAX_STEP}")
                steps.setdefault(int(ev.step), {})[tag] = float(ev.value)
    return steps


def parse_console(text: str) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for m in STEP_LINE.finditer(text):
        if len(m.group(1)) > 10:
            continue
        row = steps.setdefault(int(m.group(1)), {})
        for item in m.group(2).split(" - "):
            key, _, value = item.strip().partition(":")
            try:
                row[key] = float(value)
            except ValueError:
                continue
    return steps


def _read_text(path: Path) -> str:
    try:
        return read_regular_file(path, max_bytes=MAX_LOG_BYTES, follow_symlinks=False).decode("utf-8", "replace")
    except FileRefused as e:
        raise RunInputError(str(e)) from None


def read_rank_memory(path: Path) -> dict[int, float]:
    peaks: dict[int, float] = {}
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            for row in json.loads(line)["ranks"]:
                r, v = int(row["rank"]), float(row["peak_gib"])
                peaks[r] = max(peaks.get(r, 0.0), v) if math.isfinite(v) else v  # a NaN peak is kept, and flagged
        except (ValueError, KeyError, TypeError, OverflowError) as e:
            raise RunInputError(f"{path}:{n}: not a rank-memory record ({type(e).__name__}: {str(e)[:80]})") from None
    return peaks


def read_steps(run_dir: Path) -> tuple[dict[int, dict[str, float]], str]:
    """A run folder's metrics by step, and where they were read: TensorBoard's scalars, else trainer.log's
    console lines (the golden check's and the curves' reader)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunInputError(f"{run_dir}: not a run folder")
    tb = run_dir / "tensorboard"
    steps, source = {}, ""
    if tb.is_dir() and any(tb.rglob("events.out.tfevents.*")):
        steps, source = read_tensorboard(tb), str(tb)
    log = run_dir / "trainer.log"
    if not steps and (log.exists() or log.is_symlink()):
        steps, source = parse_console(_read_text(log)), str(log)
    if not steps:
        raise RunInputError(f"{run_dir}: no step metrics (neither tensorboard/ events nor step lines in trainer.log)")
    return steps, source


def read_run(run_dir: Path) -> RunMetrics:
    run_dir = Path(run_dir)
    steps, source = read_steps(run_dir)
    mem = run_dir / FILE_NAME
    return RunMetrics(
        steps=steps, rank_peak_gib=read_rank_memory(mem) if mem.exists() or mem.is_symlink() else {}, source=source
    )
