"""The dry run says when the run will end (issue 42, item 5): verl's rule (the smaller of total_training_steps and
total_epochs x rows // train_batch_size) over every combination of its inputs, the hours at the vendor's step time,
and one warning where the run ends sooner than asked: the A3 profiles' single epoch (~70 steps, ~17 h on
DeepScaleR) and a step count the epochs never reach."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verl_patches.launch.preflight.findings import OK, WARN, Context, HostFacts
from verl_patches.launch.preflight.report import compose, run_preflight
from verl_patches.launch.preflight.run_end import (
    CHECK,
    EPOCHS_KEY,
    STEPS_KEY,
    run_end_findings,
    run_end_text,
    run_length,
)
from verl_patches.launch.settings import load_settings
from verl_patches.trainer.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[3]
CPU = HostFacts(device="cpu")
DEEPSCALER_TRAIN_ROWS = 36_283  # 90 % of DeepScaleR's 40,315 problems (json_to_parquet's split)


@pytest.mark.parametrize(
    "asked, epochs, rows, batch",
    list(itertools.product([None, 0, 1, 70, 71, 200], [0, 1, 2, 3], [None, 0, 511, 512, 36_283], [1, 512])),
)
def test_run_length_is_verls_rule(asked, epochs, rows, batch) -> None:
    length = run_length(asked, epochs, rows, batch)
    per_epoch = None if rows is None else rows // batch
    by_epochs = None if per_epoch is None else epochs * per_epoch
    bound = asked if asked else None
    if bound is not None and (by_epochs is None or bound <= by_epochs):
        assert (length.steps, length.ended_by) == (bound, STEPS_KEY)
    else:
        assert (length.steps, length.ended_by) == (by_epochs, EPOCHS_KEY)
    assert length.per_epoch == per_epoch and length.asked == bound
    assert length.step_count_unreached == (bound is not None and length.ended_by == EPOCHS_KEY)


def test_the_a3_profile_on_deepscaler_ends_after_70_steps_about_17_hours_and_says_so_once() -> None:
    f = run_end_text(run_length(None, 1, DEEPSCALER_TRAIN_ROWS, 512), 512, DEEPSCALER_TRAIN_ROWS, 859.68, True, True)
    assert f.status == WARN and f.key == EPOCHS_KEY
    assert f.message.startswith(
        "the run ends after at most 70 steps: trainer.total_epochs=1 x 70 steps per epoch "
        "(36283 train rows // data.train_batch_size 512)"
    )
    assert "about 16.7 h at 859.68 s a step (the vendor's step table, reference §2)" in f.message
    assert "one pass over the data ends the run; for a longer run raise trainer.total_epochs" in f.message
    assert f.message.count("trainer.total_epochs") == 2


def test_a_step_count_the_epochs_never_reach_is_a_warning_naming_the_epochs_needed() -> None:
    f = run_end_text(run_length(200, 1, DEEPSCALER_TRAIN_ROWS, 512), 512, DEEPSCALER_TRAIN_ROWS, 859.68, False, True)
    assert f.status == WARN and f.key == f"{EPOCHS_KEY}, {STEPS_KEY}"
    assert "ends after 70 steps" in f.message
    assert "trainer.total_training_steps=200 is never reached; raise trainer.total_epochs to 3 to reach it" in f.message


def test_a_reachable_step_count_is_one_ok_line_with_hours() -> None:
    f = run_end_text(run_length(140, 2, DEEPSCALER_TRAIN_ROWS, 512), 512, DEEPSCALER_TRAIN_ROWS, 796.8, False, True)
    assert f.status == OK and f.message.startswith("the run ends after 140 steps (trainer.total_training_steps;")
    assert "about 31.0 h at 796.8 s a step" in f.message


def test_without_the_data_the_line_says_what_it_depends_on() -> None:
    f = run_end_text(run_length(None, 1, None, 512), 512, None, 859.68, False, True)
    assert f.status == WARN and "train rows / 512 steps per epoch (the data is read where the job runs)" in f.message
    assert "about" not in f.message  # no step count, no hours
    f = run_end_text(run_length(3, 1, None, 16), 16, None, None, False, False)
    assert f.status == OK and f.message.startswith("the run ends after 3 steps (trainer.total_training_steps")
    assert "no measured step time for this layout" in f.message


@cache
def cfg_for(profile: str, data_dir: str, *overrides: str):
    p = PROFILES[profile]
    settings = load_settings({"DATA_DIR": data_dir}, None, environ={})  # as --data-dir: the profiles read it
    return compose(p.config_name, [*p.overrides, *overrides], settings, ROOT)


@pytest.fixture
def deepscaler_sized(tmp_path: Path) -> Path:
    """train.parquet with DeepScaleR's row count (one column: only the metadata is read)."""
    pq.write_table(pa.table({"prompt": ["x"] * DEEPSCALER_TRAIN_ROWS}), tmp_path / "train.parquet")
    pq.write_table(pa.table({"prompt": ["x"] * 10}), tmp_path / "test.parquet")
    return tmp_path


@pytest.mark.parametrize(
    "profile, overrides, status, steps",
    [
        ("a3_256die_true_weight", (), WARN, "at most 70 steps"),
        ("a3_256die_random_init", (), WARN, "at most 70 steps"),
        ("a3_256die_true_weight", ("trainer.total_epochs=3", "trainer.total_training_steps=200"), OK, "at most 200"),
        ("a3_16die_smoke", (), OK, "at most 3 steps"),
    ],
)
def test_the_profiles_as_composed(deepscaler_sized: Path, profile, overrides, status, steps) -> None:
    cfg = cfg_for(profile, str(deepscaler_sized), *overrides)
    ctx = Context(cfg=cfg, settings=load_settings({}, None, environ={}), root=ROOT, host=CPU)
    (f,) = run_end_findings(ctx)
    assert (f.check, f.status) == (CHECK, status) and steps in f.message, f.message


def test_the_dry_run_prints_the_line(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    cfg = compose(PROFILES["tiny"].config_name, [], load_settings({}, None, environ={}), ROOT)
    found = [f for f in run_preflight(cfg, load_settings({}, None, environ={}), ROOT, CPU) if f.check == CHECK]
    assert len(found) == 1 and found[0].message.startswith("the run ends after ")
