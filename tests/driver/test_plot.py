"""The run's curves as a PNG (`verl_patches.driver.plot`), drawn from run folders written as a real run writes
them (TensorBoard scalars through torch's SummaryWriter, verl's console lines), and its pure axis arithmetic."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw

from verl_patches.driver import plot
from verl_patches.driver.run_metrics import DRIFT_KEY, REWARD_KEY, VAL_KEY
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def write_events(folder: Path, rows: dict[int, dict[str, float]]) -> Path:
    """TensorBoard scalars as verl's tracking writes them (torch's SummaryWriter), in folder/tensorboard."""
    from torch.utils.tensorboard import SummaryWriter

    folder.mkdir(parents=True, exist_ok=True)
    w = SummaryWriter(str(folder / "tensorboard"))
    for s, m in rows.items():
        for k, v in m.items():
            w.add_scalar(k, v, s)
    w.close()
    return folder


def healthy_rows(steps: int = 12, kl: bool = True) -> dict[int, dict[str, float]]:
    rows: dict[int, dict[str, float]] = {}
    for s in range(1, steps + 1):
        rows[s] = {
            REWARD_KEY: 0.1 + 0.03 * s,
            "response_length/mean": 9.0 + 0.1 * s,
            ABS_DIFF: 2e-4 * (1 + 0.1 * (s % 3)),
            "rollout/graph_decode_token_share": 0.8,
            "actor/pg_loss": 0.1,
        }
        if kl:
            rows[s][DRIFT_KEY] = 0.001 * s
    for s in range(0, steps + 1, 5):
        rows.setdefault(s, {})[VAL_KEY] = 0.3 + 0.01 * s
    return rows


@pytest.fixture
def drawn_texts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the drawing puts on the image (drawn as usual, and recorded)."""
    texts: list[str] = []
    original = ImageDraw.ImageDraw.text

    def text(self: Any, xy: Any, content: str, *args: Any, **kwargs: Any) -> Any:
        texts.append(content)
        return original(self, xy, content, *args, **kwargs)

    monkeypatch.setattr(ImageDraw.ImageDraw, "text", text)
    return texts


def panel_pixels(image: Image.Image, index: int) -> list[tuple[int, int, int]]:
    x0, y0 = (index % plot.COLUMNS) * plot.PANEL_W, plot.TITLE_H + (index // plot.COLUMNS) * plot.PANEL_H
    return list(image.crop((x0, y0, x0 + plot.PANEL_W, y0 + plot.PANEL_H)).getdata())


def test_a_run_folder_gets_a_valid_png_of_the_expected_size(tmp_path: Path) -> None:
    run = write_events(tmp_path / "tiny-20260101-000000-local-host", healthy_rows())
    assert plot.main([str(run)]) == 0
    png = run / plot.FILE_NAME
    data = png.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    with Image.open(png) as image:
        image.verify()  # the whole stream: chunks and their checksums
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (plot.WIDTH, plot.HEIGHT) == (1500, 880)
        pixels = image.convert("RGB")
    # every panel has data here: each holds the first curve colour
    for i in range(len(plot.PANELS)):
        assert plot.COLORS[0] in panel_pixels(pixels, i), plot.PANELS[i]
    assert not [p.name for p in run.iterdir() if p.name.startswith(".verl_patches-tmp")]  # written whole


def test_a_missing_metric_gets_a_panel_saying_so(tmp_path: Path, drawn_texts: list[str]) -> None:
    run = write_events(tmp_path / "run", healthy_rows(kl=False))
    out = plot.write_curves(run)
    kl = [i for i, p in enumerate(plot.PANELS) if p.key == DRIFT_KEY][0]
    assert f"not logged by this run:\n{DRIFT_KEY}" in drawn_texts
    assert sum(t.startswith("not logged by this run:\n") for t in drawn_texts) == 1  # only that panel
    with Image.open(out) as image:
        pixels = image.convert("RGB")
    assert plot.COLORS[0] not in panel_pixels(pixels, kl)  # no curve on the KL panel
    assert plot.COLORS[0] in panel_pixels(pixels, 0)  # the reward's is there


def test_non_finite_values_are_counted_not_drawn(tmp_path: Path, drawn_texts: list[str]) -> None:
    rows = healthy_rows()
    rows[3][REWARD_KEY] = float("nan")
    rows[4][REWARD_KEY] = float("inf")
    for s in rows:
        if ABS_DIFF in rows[s]:
            rows[s][ABS_DIFF] = float("nan")  # a whole curve of NaN
    plot.write_curves(write_events(tmp_path / "run", rows))
    assert "2 value(s) not drawn (not finite, or beyond 1e+15)" in drawn_texts
    assert "12 value(s) not drawn (not finite, or beyond 1e+15)" in drawn_texts


def test_a_run_with_only_console_lines_is_drawn_from_them(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    lines = [f"step:{s} - {REWARD_KEY}:{0.1 * s:.3f} - response_length/mean:9.000" for s in range(1, 6)]
    (run / "trainer.log").write_text("noise\n" + "\n".join(lines) + "\n")
    out = run / "elsewhere.png"
    assert plot.main([str(run), "--out", str(out)]) == 0
    with Image.open(out) as image:
        assert image.size == (plot.WIDTH, plot.HEIGHT)
    assert not (run / plot.FILE_NAME).exists()


@pytest.mark.parametrize("kind", ["missing", "file", "empty", "no-step-lines"])
def test_a_bad_run_dir_is_one_line_and_exit_2(tmp_path: Path, kind: str, capsys: pytest.CaptureFixture) -> None:
    target = tmp_path / "run"
    if kind == "file":
        target.write_text("x")
    elif kind in ("empty", "no-step-lines"):
        target.mkdir()
        if kind == "no-step-lines":
            (target / "trainer.log").write_text("the trainer never reached a step\n")
    assert plot.main([str(target)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1 and err.startswith(f"plot: {target}")
    assert not (tmp_path / "run" / plot.FILE_NAME).exists()


def test_an_unwritable_target_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = write_events(tmp_path / "run", healthy_rows(3))
    (tmp_path / "a-file").write_text("x")
    assert plot.main([str(run), "--out", str(tmp_path / "a-file" / "c.png")]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and err.startswith("plot: ")


def test_the_end_of_a_run_never_raises(tmp_path: Path) -> None:
    assert "no run folder" in plot.end_of_run(None)
    line = plot.end_of_run(tmp_path / "missing")
    assert line.startswith("curves: not drawn (RunInputError") and "python -m verl_patches.driver.plot" in line
    run = write_events(tmp_path / "run", healthy_rows(3))
    assert plot.end_of_run(run) == f"curves of this run: {run / plot.FILE_NAME}"
    assert (run / plot.FILE_NAME).read_bytes().startswith(PNG_SIGNATURE)


def test_panel_series_picks_each_panels_metric_and_every_validation_source() -> None:
    steps = {
        0: {"val-core/deepscaler/reward/mean@1": 0.2, "val-core/gsm8k/acc/mean@4": 0.5, "val-aux/x/y/std@1": 9.0},
        2: {REWARD_KEY: 0.5},
        1: {REWARD_KEY: 0.4, "val-core/deepscaler/reward/mean@1": 0.3},
    }
    reward = next(p for p in plot.PANELS if p.key == REWARD_KEY)
    validation = next(p for p in plot.PANELS if not p.key)
    assert plot.panel_series(steps, reward) == {REWARD_KEY: [(1, 0.4), (2, 0.5)]}
    assert plot.panel_series(steps, validation) == {
        "val-core/deepscaler/reward/mean@1": [(0, 0.2), (1, 0.3)],
        "val-core/gsm8k/acc/mean@4": [(0, 0.5)],
    }


finite = st.floats(-1e15, 1e15, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(st.one_of(finite, st.sampled_from([math.nan, math.inf, -math.inf, 1e300])), max_size=50))
def test_the_axis_holds_every_drawable_value_and_has_readable_ticks(values: list[float]) -> None:
    lo, hi = plot.axis_range(values)
    assert math.isfinite(lo) and math.isfinite(hi) and lo < hi
    good = [v for v in values if plot.drawable(v)]
    assert all(lo <= v <= hi for v in good)
    ticks = plot.nice_ticks(lo, hi)
    assert 2 <= len(ticks) <= plot.MAX_TICKS
    assert ticks == sorted(set(ticks)) and all(lo - 1e-9 * (hi - lo) <= t <= hi + 1e-9 * (hi - lo) for t in ticks)
    spacing = ticks[1] - ticks[0]
    labels = [plot.tick_label(t, spacing) for t in ticks]
    assert len(set(labels)) == len(labels), labels  # neighbouring ticks never read alike


@settings(max_examples=300, deadline=None)
@given(lo=finite, width=st.floats(1e-9, 1e15), n=st.integers(2, 12), integer=st.booleans())
def test_ticks_are_round_evenly_spaced_and_bounded(lo: float, width: float, n: int, integer: bool) -> None:
    hi = lo + width
    if not hi - lo >= plot.FLAT / 10 * max(abs(lo), abs(hi)):  # too narrow for its magnitude (or rounded away)
        with pytest.raises(ValueError):
            plot.nice_ticks(lo, hi, n, integer=integer)
        return
    ticks = plot.nice_ticks(lo, hi, n, integer=integer)
    assert 2 <= len(ticks) <= n
    if len(ticks) > 2 or ticks != [lo, hi]:
        step = ticks[1] - ticks[0]
        mantissa = step / 10 ** math.floor(math.log10(step))
        assert any(math.isclose(mantissa, m, rel_tol=1e-6) for m in (1, 2, 2.5, 5, 10)), step
        assert all(math.isclose(b - a, step, rel_tol=1e-6, abs_tol=1e-9 * abs(b)) for a, b in zip(ticks, ticks[1:]))
        if integer:
            assert step >= 1


def test_no_ticks_for_an_empty_or_broken_range() -> None:
    for lo, hi in ((1.0, 1.0), (2.0, 1.0), (0.0, math.inf), (math.nan, 1.0), (0.0, 5e-324)):
        with pytest.raises(ValueError):
            plot.nice_ticks(lo, hi)


@pytest.mark.parametrize(
    "value, spacing, text",
    [
        (0.0, 0.1, "0"),
        (0.3, 0.1, "0.3"),
        (0.225, 0.025, "0.225"),
        (250, 50, "250"),
        (1500, 250, "1500"),
        (2.5, 2.5, "2.5"),
        (0.00025, 0.00005, "0.00025"),
        (1.0000002, 1e-7, "1.0000002"),
        (2e-9, 1e-9, "2e-09"),
        (3_000_000, 1_000_000, "3e+06"),
        (1_250_000, 250_000, "1.25e+06"),
    ],
)
def test_tick_labels(value: float, spacing: float, text: str) -> None:
    assert plot.tick_label(value, spacing) == text


def test_pixels_map_the_range_onto_the_span() -> None:
    assert plot.to_pixel(0.0, 0.0, 1.0, 100, 0) == 100
    assert plot.to_pixel(1.0, 0.0, 1.0, 100, 0) == 0
    assert plot.to_pixel(0.25, 0.0, 1.0, 0, 400) == 100
