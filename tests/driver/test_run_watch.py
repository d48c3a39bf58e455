"""A run you can watch, through the fit loop with the fake workers of fit_fakes and verl's own tracker
writing TensorBoard: one compact line per step (and one for the validation before training), verl's full
metrics in TensorBoard, and the curves' PNG in the run folder at the end."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from fit_fakes import STEPS, fit_config, make_trainer  # the fit loop's fake workers
from verl_patches.driver import fit_loop, plot, run_metrics
from verl_patches.driver.step_plan import StepPlan


@pytest.fixture(scope="module")
def watch_cfg() -> Any:
    return fit_config("tensorboard")


def run_watched(watch_cfg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **cfg_over: Any) -> Path:
    from verl.utils import tracking

    real_tracking = tracking.Tracking
    t, _ = make_trainer(watch_cfg, monkeypatch, StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False))
    monkeypatch.setattr(tracking, "Tracking", real_tracking)  # verl's own: TensorBoard events as in a run
    run = tmp_path / "tiny-20260101-000000-local-host"
    monkeypatch.delenv("VERL_PATCHES_RUN_DIR", raising=False)
    monkeypatch.setenv("TENSORBOARD_DIR", str(run / "tensorboard"))  # what the launcher sets
    for key, value in cfg_over.items():
        setattr(t, key, value)
    fit_loop.run_fit(t, StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False))
    return run


def test_each_step_prints_one_line_and_the_end_draws_the_curves(
    watch_cfg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = run_watched(watch_cfg, monkeypatch, tmp_path)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("[step ")]
    assert [line.split("]")[0] for line in lines] == [f"[step {s}/{STEPS}" for s in range(1, STEPS + 1)]
    for line in lines:
        # tok/s per card with our step-metrics patch (the prelude's); verl's per worker without it, as here
        assert re.search(r"\] ETA \d+s \(\d+s in\) \| \d+ tok/s/(card|worker) \| reward 0.500 \| resp 2.88 \|", line)
        assert "| mismatch 1.0e-02 |" in line  # the fake actor's reported drift
        assert "s: gen " in line and " ref " in line and " update " in line
    assert lines[-1].split("] ")[1].startswith("ETA 0s")
    # verl's full metrics are in TensorBoard at full precision, read by the golden check's reader
    steps = run_metrics.read_run(run).steps
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert steps[1]["critic/score/mean"] == 0.5 and "timing_s/step" in steps[1] and "perf/throughput" in steps[1]
    assert f"curves of this run: {run / plot.FILE_NAME}" in out.splitlines()
    with Image.open(run / plot.FILE_NAME) as image:
        assert image.format == "PNG" and image.size == (plot.WIDTH, plot.HEIGHT)


def test_the_validation_before_training_has_its_line(
    watch_cfg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    monkeypatch.setattr(RayPPOTrainer, "_validate", lambda self: {"val-core/deepscaler/reward/mean@1": 0.125})
    run_watched(watch_cfg, monkeypatch, tmp_path, val_reward_fn=object())
    out = capsys.readouterr().out.splitlines()
    assert out.index(f"[step 0/{STEPS}] | val 0.125") < out.index(next(x for x in out if x.startswith("[step 1/")))


def test_each_step_reaches_the_tensorboard_file_when_it_is_logged(
    watch_cfg: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """What TensorBoard (or a reader after a kill) sees at each step line: every metric of every step logged so far,
    not what verl's writer would flush on its two-minute timer or a full queue."""
    seen: list[dict[int, set[str]]] = []
    real_line = fit_loop._print_step_line
    run = tmp_path / "tiny-20260101-000000-local-host"

    def step_line_and_look(trainer: Any, metrics: dict[str, Any], *args: Any) -> None:
        steps = run_metrics.read_run(run).steps if (run / "tensorboard").is_dir() else {}
        seen.append({step: set(values) for step, values in steps.items()})
        real_line(trainer, metrics, *args)

    monkeypatch.setattr(fit_loop, "_print_step_line", step_line_and_look)
    run_watched(watch_cfg, monkeypatch, tmp_path)
    final = {step: set(values) for step, values in run_metrics.read_run(run).steps.items()}
    assert [sorted(s) for s in seen] == [list(range(1, n + 1)) for n in range(1, STEPS + 1)], seen
    for n, at_line in enumerate(seen, start=1):
        assert at_line[n] == final[n], (n, sorted(final[n] - at_line[n]))
