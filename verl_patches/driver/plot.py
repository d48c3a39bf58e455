"""The curves of a run as one PNG: ``python -m verl_patches.driver.plot RUN_DIR [--out FILE]``.

Six panels, by training step: the reward (``critic/score/mean``), validation (``val-core/<source>/.../mean@N``,
one curve per data source), the response length (``response_length/mean``), the policy's KL to the reference
(``actor/kl_loss``), the rollout/training log-prob mismatch (``rollout_mismatch/logprob_abs_diff_mean``) and the
graph-decode share (``rollout/graph_decode_token_share``). One compares the shapes with a healthy run's, not the
numbers (those are in TensorBoard at full precision). The metrics are read the way the golden check reads them
(`run_metrics.read_steps`: TensorBoard's events, else trainer.log's console lines); a metric the run did not log gets
a panel that says so, and values that are not finite are counted on their panel, not drawn.

Written as ``RUN_DIR/curves.png`` (`FILE_NAME`) at the end of a run by the fit loop, and by this command at any
time, whole or not at all (`base.atomic_write`; the run folder is private to the account, `launch.run_dir`). Drawn
with Pillow, which the pinned environment already has (requirements.txt's pillow==11.2.1, a dependency of vLLM
0.9.1): matplotlib is not in it, and six line charts do not justify a plotting stack's worth of new pins
(matplotlib, contourpy, cycler, fonttools, kiwisolver) on the A3 hosts.

Exit status: 0 written, 2 a RUN_DIR that is not a run folder or has no step metrics (one line on stderr).
"""

from __future__ import annotations

import argparse
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import write_bytes_atomically
from verl_patches.driver.run_metrics import DRIFT_KEY, REWARD_KEY, RunInputError, read_steps
from verl_patches.driver.step_line import RESPONSE_KEY, VAL_PATTERN
from verl_patches.rollout.decode_share import SHARE
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF

FILE_NAME = "curves.png"
COLUMNS, ROWS = 3, 2
PANEL_W, PANEL_H = 500, 420
TITLE_H = 40
WIDTH, HEIGHT = COLUMNS * PANEL_W, TITLE_H + ROWS * PANEL_H
MAX_ABS = 1e15  # larger magnitudes are counted with the non-finite values: no metric of a run reaches it
MIN_SPAN = 1e-12  # the narrowest y axis: values closer than this are drawn as a flat line
FLAT = 1e-6  # ... and so are values within this fraction of their magnitude (below it ticks would round alike)
MAX_TICKS = 6
COLORS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189), (140, 86, 75))
EXIT_OK, EXIT_USAGE = 0, 2

Series = list[tuple[int, float]]


@dataclass(frozen=True)
class Panel:
    title: str
    key: str  # the metric, or "" for the validation panel (every key of VAL_PATTERN)


PANELS = (
    Panel("reward", REWARD_KEY),
    Panel("validation", ""),
    Panel("response length", RESPONSE_KEY),
    Panel("KL to the reference", DRIFT_KEY),
    Panel("rollout mismatch", ABS_DIFF),
    Panel("graph-decode share", SHARE),
)


# ---- what to draw (pure) ---------------------------------------------------------------------------------


def panel_series(steps: dict[int, dict[str, float]], panel: Panel) -> dict[str, Series]:
    """The panel's curves by label (one, or one per validation data source), points in step order."""
    out: dict[str, Series] = {}
    for step in sorted(steps):
        for key, value in steps[step].items():
            if panel.key:
                label = panel.key if key == panel.key else None
            else:
                m = VAL_PATTERN.fullmatch(key)
                label = key if m else None
            if label is not None:
                out.setdefault(label, []).append((step, value))
    return dict(sorted(out.items()))


def drawable(value: float) -> bool:
    return math.isfinite(value) and abs(value) <= MAX_ABS


def axis_range(values: list[float]) -> tuple[float, float]:
    """lo < hi around the drawable values, with a margin; a flat series gets a band around its value."""
    values = [v for v in values if drawable(v)]
    if not values:
        return 0.0, 1.0
    lo, hi = min(values), max(values)
    scale = max(abs(lo), abs(hi))
    if hi - lo <= max(FLAT * scale, MIN_SPAN):
        mid = (lo + hi) / 2
        pad = max(0.1 * scale, MIN_SPAN) if scale > 0 else 1.0
        return mid - pad, mid + pad
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


def nice_ticks(lo: float, hi: float, max_ticks: int = MAX_TICKS, integer: bool = False) -> list[float]:
    """Round tick values in [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart; at least 1 apart when
    `integer`), at most `max_ticks` of them and at least two."""
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi and math.isfinite(hi - lo)) or max_ticks < 2:
        raise ValueError(f"no ticks for [{lo}, {hi}] with {max_ticks} ticks at most")
    if hi - lo < FLAT / 10 * max(abs(lo), abs(hi)):
        raise ValueError(f"no ticks for [{lo}, {hi}]: narrower than float ticks can tell apart at that magnitude")
    raw = (hi - lo) / (max_ticks - 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next((m * mag for m in (1, 2, 2.5, 5, 10, 20) if m * mag >= raw), 0.0)
    if not (step > 0 and math.isfinite(step)):
        raise ValueError(f"no ticks for [{lo}, {hi}]: the range is below float resolution")
    if integer and step % 1:  # below 1, or 2.5: the next round step that is a whole number
        step = 5.0 if step > 1 else 1.0
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    ticks = [k * step for k in range(first, last + 1)]
    ticks = [t for t in ticks if lo - 1e-9 * step <= t <= hi + 1e-9 * step]
    if len(ticks) < 2:  # a range narrower than one integer step
        ticks = [lo, hi]
    return ticks[:max_ticks]


def tick_label(value: float, spacing: float) -> str:
    """A tick's text, with as many digits as the tick spacing needs (so neighbouring ticks never read alike)."""
    if value == 0:
        return "0"
    if not (spacing > 0 and math.isfinite(spacing)):
        return f"{value:.3g}"
    decimals = -math.floor(math.log10(spacing) + 1e-9)
    scaled = spacing * 10.0**decimals
    if abs(round(scaled) - scaled) > 1e-6:
        decimals += 1  # a spacing of 2.5 times a power of ten
    if abs(value) < 1e6 and decimals <= 5:
        return f"{value:.{max(decimals, 0)}f}"
    digits = math.floor(math.log10(abs(value))) + decimals + 1
    return f"{value:.{max(digits, 1)}g}"


def to_pixel(value: float, lo: float, hi: float, p0: float, p1: float) -> float:
    """`value` of [lo, hi] on the pixel span p0 -> p1 (p1 < p0 for a y axis)."""
    return p0 + (value - lo) / (hi - lo) * (p1 - p0)


# ---- drawing ---------------------------------------------------------------------------------------------


def _font(size: int) -> Any:
    # lazy: Pillow is needed only to draw; importing this module (its pure part) stays light
    from PIL import ImageFont

    return ImageFont.load_default(size=size)


def _draw_panel(draw: Any, x0: int, y0: int, panel: Panel, curves: dict[str, Series]) -> None:
    small, text = _font(12), _font(14)
    left, right, top, bottom = x0 + 75, x0 + PANEL_W - 20, y0 + 46, y0 + PANEL_H - 45
    name = panel.key or "val-core/<source>/.../mean@N"
    draw.text((x0 + 10, y0 + 6), f"{panel.title}  ({name})", fill="black", font=text)
    draw.rectangle((left, top, right, bottom), outline=(120, 120, 120))
    if not curves:
        draw.text(
            ((left + right) / 2, (top + bottom) / 2),
            f"not logged by this run:\n{name}",
            fill=(150, 0, 0),
            font=text,
            anchor="mm",
            align="center",
        )
        return
    points = [p for series in curves.values() for p in series]
    good = [(s, v) for s, v in points if drawable(v)]
    skipped = len(points) - len(good)
    xs = [s for s, _ in good] or [s for s, _ in points]
    xlo, xhi = (min(xs) - 1, max(xs) + 1) if min(xs) == max(xs) else (min(xs), max(xs))
    ylo, yhi = axis_range([v for _, v in good])
    xticks, yticks = nice_ticks(xlo, xhi, integer=True), nice_ticks(ylo, yhi)
    yspacing = yticks[1] - yticks[0] if len(yticks) > 1 else yhi - ylo
    for t in yticks:
        y = to_pixel(t, ylo, yhi, bottom, top)
        draw.line((left, y, right, y), fill=(228, 228, 228))
        draw.text((left - 6, y), tick_label(t, yspacing), fill="black", font=small, anchor="rm")
    for t in xticks:
        x = to_pixel(t, xlo, xhi, left, right)
        draw.line((x, bottom, x, bottom + 4), fill=(120, 120, 120))
        draw.text((x, bottom + 6), f"{t:.0f}", fill="black", font=small, anchor="mt")
    draw.text(((left + right) / 2, bottom + 24), "step", fill="black", font=small, anchor="mt")
    for i, (label, series) in enumerate(curves.items()):
        color = COLORS[i % len(COLORS)]
        xy = [
            (to_pixel(s, xlo, xhi, left, right), to_pixel(v, ylo, yhi, bottom, top)) for s, v in series if drawable(v)
        ]
        if len(xy) > 1:
            draw.line(xy, fill=color, width=2)
        for x, y in xy if len(xy) <= 60 else []:
            draw.ellipse((x - 2.5, y - 2.5, x + 2.5, y + 2.5), fill=color)
        if len(curves) > 1:  # the legend, between the title and the frame
            draw.text((left + 130 * i, top - 18), f"- {label.split('/')[1][:18]}", fill=color, font=small)
    if skipped:
        note = f"{skipped} value(s) not drawn (not finite, or beyond {MAX_ABS:.0e})"
        draw.text((right - 6, top + 6), note, fill=(200, 0, 0), font=small, anchor="ra")


def render(steps: dict[int, dict[str, float]], title: str) -> Any:
    """The PNG's image (a Pillow Image of WIDTH x HEIGHT)."""
    # lazy: Pillow is needed only to draw; importing this module (its pure part) stays light
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (WIDTH, HEIGHT), "white")
    draw = ImageDraw.Draw(image)
    draw.text((10, 10), title, fill="black", font=_font(16))
    for i, panel in enumerate(PANELS):
        x0, y0 = (i % COLUMNS) * PANEL_W, TITLE_H + (i // COLUMNS) * PANEL_H
        _draw_panel(draw, x0, y0, panel, panel_series(steps, panel))
    return image


def png_bytes(image: Any) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def write_curves(run_dir: Path, out: Path | None = None) -> Path:
    """Draw RUN_DIR's curves into `out` (default RUN_DIR/curves.png); RunInputError for a folder without
    step metrics."""
    run_dir = Path(run_dir)
    steps, source = read_steps(run_dir)
    last = max(steps)
    title = f"{run_dir.resolve().name}: {len(steps)} steps logged, last {last} (read from {Path(source).name})"
    target = Path(out) if out is not None else run_dir / FILE_NAME
    write_bytes_atomically(target, png_bytes(render(steps, title)))
    return target


def end_of_run(run_dir: Path | None) -> str:
    """The fit loop's last act: the curves written, and one line saying where (or why not). Never raises: the
    run's training is done when this runs."""
    if run_dir is None:
        return "curves: not drawn (no run folder: VERL_PATCHES_RUN_DIR and TENSORBOARD_DIR are unset)"
    try:
        return f"curves of this run: {write_curves(run_dir)}"
    except Exception as e:  # noqa: BLE001 - a picture must never turn a finished run into a failed one
        return f"curves: not drawn ({type(e).__name__}: {e}); later: python -m verl_patches.driver.plot {run_dir}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.driver.plot",
        description="Draw a run's reward, validation, response length, KL, mismatch and graph-decode curves as a "
        "PNG (read from its TensorBoard events).",
    )
    p.add_argument("run_dir", type=Path, help="the run's log folder, logs/<profile>-<time>-<role>-<host>/")
    p.add_argument("--out", type=Path, help=f"where to write the PNG (default RUN_DIR/{FILE_NAME})")
    args = p.parse_args(argv)
    try:
        print(f"plot: wrote {write_curves(args.run_dir, args.out)}")
    except RunInputError as e:
        print(f"plot: {e}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as e:
        print(f"plot: {e.filename or args.run_dir}: {e.strerror or e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
