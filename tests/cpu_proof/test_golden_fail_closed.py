"""The golden check fails closed (issue 32 item 2): NaN never passes, a baseline is validated before use,
a baseline is never recorded from runs with non-finite values, every malformed input is one line (exit 2),
and nothing blocks on a FIFO."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_golden import RECORDED, write_run  # noqa: F401  (the synthetic runs of the golden tests)
from verl_patches.cpu_proof import golden
from verl_patches.driver import rank_memory
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("golden-fc")
    runs = [
        write_run(root / f"base{i}", reward_shift=shift, mem=mem, val_shift=shift)
        for i, (shift, mem) in enumerate(RECORDED)
    ]
    out = root / "baseline.json"
    assert golden.main([*map(str, runs), "--write-baseline", str(out)]) == 0
    return out


@contextlib.contextmanager
def deadline(seconds: int = 20):
    def fail(*_):
        raise TimeoutError("the golden check blocked")

    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run_main(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with deadline(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = golden.main(list(args))
    return rc, out.getvalue(), err.getvalue()


def poison(run: Path, cells: dict[int, list[str]], value: float = math.nan) -> Path:
    """Append non-finite scalars at the given steps (TensorBoard keeps the last value per step and tag)."""
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(run / "tensorboard"))
    for step, keys in cells.items():
        for k in keys:
            w.add_scalar(k, value, step)
    w.close()
    return run


def test_a_run_whose_every_metric_is_nan_fails_naming_metric_and_step(tmp_path, baseline) -> None:
    run = write_run(tmp_path / "r")
    cells = {s: [golden.REWARD_KEY, ABS_DIFF, golden.STEP_TIME_KEY] for s in range(1, 31)}
    for s in (0, 10, 20, 30):
        cells.setdefault(s, []).append(golden.VAL_KEY)
    poison(run, cells)
    rc, out, _ = run_main(str(run), "--check-against", str(baseline))
    assert rc == 1
    assert f"REGRESSION {golden.REWARD_KEY} [step 7]: non-finite value nan" in out
    assert f"REGRESSION {golden.VAL_KEY} [step 20]: non-finite value nan" in out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_one_non_finite_value_per_window_cannot_hide_a_failing_run(tmp_path, baseline, value) -> None:
    """A run 0.3 below the baseline (what a learning rate of 0 looks like) with one NaN per reward window and at
    the validation steps: the NaN values are regressions themselves."""
    run = write_run(tmp_path / "r", reward_shift=-0.3, val_shift=-0.3)
    poison(
        run,
        {
            1: [golden.REWARD_KEY],
            11: [golden.REWARD_KEY],
            21: [golden.REWARD_KEY],
            0: [golden.VAL_KEY],
            30: [golden.VAL_KEY],
        },
        value,
    )
    rc, out, _ = run_main(str(run), "--check-against", str(baseline))
    assert rc == 1 and out.count("non-finite value") == 5


def test_a_non_finite_memory_peak_is_a_regression_naming_the_rank(tmp_path, baseline) -> None:
    run = write_run(tmp_path / "r")
    rank_memory.append(run / rank_memory.FILE_NAME, 31, [{"rank": 2, "peak_gib": float("nan")}])
    rc, out, _ = run_main(str(run), "--check-against", str(baseline))
    assert rc == 1 and "REGRESSION memory [rank 2]: non-finite peak nan GiB" in out


def test_recording_refuses_runs_with_non_finite_values(tmp_path) -> None:
    runs = [write_run(tmp_path / f"b{i}", reward_shift=shift, mem=mem) for i, (shift, mem) in enumerate(RECORDED)]
    poison(runs[1], {4: [golden.REWARD_KEY]})
    out = tmp_path / "baseline.json"
    rc, _, err = run_main(*map(str, runs), "--write-baseline", str(out))
    assert rc == 2 and "non-finite" in err and "[step 4]" in err and not out.exists()
    assert err.count("\n") == 1


def _baseline_doc(baseline: Path) -> dict:
    return json.loads(baseline.read_text())


BAD_BASELINES = [
    ("NaN floor", lambda d: d["reward"]["windows"][0].__setitem__("floor", math.nan), "line"),
    ("Infinity tolerance", lambda d: d["tolerances"].__setitem__("reward_abs", math.inf), "line"),
    ("slack of 10", lambda d: d["tolerances"].__setitem__("reward_abs", 10), "'tolerances.reward_abs'"),
    ("negative slack", lambda d: d["tolerances"].__setitem__("val_abs", -1), "'tolerances.val_abs'"),
    ("factor 1e9", lambda d: d["tolerances"].__setitem__("mismatch_factor", 1e9), "'tolerances.mismatch_factor'"),
    ("window 0", lambda d: d["tolerances"].__setitem__("reward_window", 0), "'tolerances.reward_window'"),
    ("bool tolerance", lambda d: d["tolerances"].__setitem__("memory_rel", True), "'tolerances.memory_rel'"),
    ("string step", lambda d: d["reward"]["steps"].__setitem__(0, "1"), "'reward.steps'"),
    ("reversed window", lambda d: d["reward"]["windows"][0].__setitem__("steps", [10, 1]), "'reward.windows'"),
    ("string value", lambda d: d["reward"]["values"].__setitem__(2, "0.5"), "'reward.values'"),
    ("rank name", lambda d: d["rank_peak_gib"].__setitem__("zero", 1.0), "'rank_peak_gib'"),
    ("negative mismatch", lambda d: d["mismatch_max"].__setitem__(ABS_DIFF, -1.0), "'mismatch_max'"),
    ("string step time", lambda d: d.__setitem__("step_time_median_s", "1"), "'step_time_median_s'"),
    ("validation floors short", lambda d: d["validation"]["floors"].pop(), "'validation'"),
    ("NaN rise", lambda d: d["validation"].__setitem__("rise_floor", math.nan), "line"),
    ("negative drift floor", lambda d: d["drift"]["windows"][0].__setitem__("floor", -0.1), "'drift.windows'"),
    ("drift steps", lambda d: d["drift"].__setitem__("steps", [3, 2]), "'drift'"),
    ("drift factor 2", lambda d: d["tolerances"].__setitem__("drift_factor", 2), "'tolerances.drift_factor'"),
    ("schema true", lambda d: d.__setitem__("schema", True), "'schema'"),
    ("a list", lambda d: d.clear(), "'schema'"),
]


@pytest.mark.parametrize("name, edit, needle", BAD_BASELINES, ids=[b[0] for b in BAD_BASELINES])
def test_a_malformed_baseline_is_refused_in_one_line(tmp_path, baseline, name, edit, needle) -> None:
    doc = _baseline_doc(baseline)
    edit(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))  # json.dumps writes NaN / Infinity as the bare words
    run = write_run(tmp_path / "r", reward_shift=-0.3)  # would fail the real baseline
    rc, out, err = run_main(str(run), "--check-against", str(bad))
    assert rc == 2 and out == "" and needle in err and err.count("\n") == 1 and str(bad) in err


@pytest.mark.parametrize("where", ["baseline", "event file", "rank memory", "trainer.log"])
def test_a_fifo_is_refused_without_blocking(tmp_path, baseline, where) -> None:
    run = write_run(tmp_path / "r", console_only=where == "trainer.log")
    target = {
        "baseline": tmp_path / "fifo.json",
        "event file": run / "tensorboard" / "events.out.tfevents.0.fifo",
        "rank memory": run / rank_memory.FILE_NAME,
        "trainer.log": run / "trainer.log",
    }[where]
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    against = target if where == "baseline" else baseline
    rc, _, err = run_main(str(run), "--check-against", str(against))
    assert rc == 2 and "not a regular file" in err and err.count("\n") == 1


@pytest.mark.parametrize("content", [b"\xff\xfe garbage", b"x" * 100, b"\x00" * 64])
def test_a_damaged_event_file_or_log_is_one_line(tmp_path, baseline, content) -> None:
    run = write_run(tmp_path / "r")
    (run / "tensorboard" / "events.out.tfevents.9.broken").write_bytes(content)
    (run / rank_memory.FILE_NAME).write_bytes(b'{"ranks": [{"rank": 1e400, "peak_gib": 1}]}\n' + content)
    rc, _, err = run_main(str(run), "--check-against", str(baseline))
    assert rc in (1, 2) and "Traceback" not in err and err.count("\n") <= 1


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=True) | st.text(max_size=5),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
    max_leaves=12,
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    path=st.lists(
        st.sampled_from(
            [
                "tolerances",
                "reward",
                "windows",
                "steps",
                "values",
                "validation",
                "rank_peak_gib",
                "mismatch_max",
                "floors",
                "rise_floor",
                "floor",
                0,
                1,
                "reward_abs",
                "step_time_median_s",
                "schema",
            ]
        ),
        min_size=1,
        max_size=4,
    ),
    value=JSONISH,
)
def test_property_any_edit_of_a_baseline_is_a_verdict_or_one_line(tmp_path_factory, baseline, path, value) -> None:
    doc = _baseline_doc(baseline)
    node = doc
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return
    try:
        node[path[-1]] = value
    except (TypeError, IndexError):
        return
    try:
        valid = golden.validate_baseline(json.loads(json.dumps(doc)), "b")
    except golden.GoldenInputError as e:
        assert "\n" not in str(e)
        return
    run = golden.read_run(_property_run(tmp_path_factory))
    checks = golden.compare(run, valid)  # never raises on a baseline that validated
    assert all(c.status in ("ok", "regression", "info") for c in checks)


_RUN: list[Path] = []


def _property_run(factory) -> Path:
    if not _RUN:
        _RUN.append(write_run(factory.mktemp("prop") / "r"))
    return _RUN[0]
