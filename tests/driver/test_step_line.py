"""The compact step line (`step_line`): what it shows for a step's metrics, the ETA, and that it stays one short
line that verl's console parsers (`run_metrics.parse_console`, the end-to-end tests) never read as a step."""

from __future__ import annotations

import math
import re
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import docs_text
from verl_patches.driver import run_metrics
from verl_patches.driver.step_line import (
    CARD_THROUGHPUT_KEY,
    MAX_LENGTH,
    PHASES,
    PREFIX,
    eta_seconds,
    fmt_amount,
    fmt_duration,
    step_line,
)
from verl_patches.rollout.decode_share import SHARE
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF

# an A3 step as the vendor's step table reports it (true weight, step 2), with our extra metrics
A3_STEP = {
    "critic/score/mean": 0.4123,
    "response_length/mean": 1576.6,
    "perf/throughput": 61.58,
    CARD_THROUGHPUT_KEY: 123.16,
    ABS_DIFF: 0.00213,
    SHARE: 0.9912,
    "timing_s/step": 859.68,
    "timing_s/gen": 390.65,
    "timing_s/reshard": 17.0,
    "timing_s/reward": 5.0,
    "timing_s/ref": 144.5,
    "timing_s/adv": 0.21,
    "timing_s/update_actor": 319.3,
    "timing_s/save_checkpoint": 960.0,
    "timing_s/testing": 391.0,
    "val-core/deepscaler/reward/mean@1": 0.5031,
    "val-aux/deepscaler/reward/best@1/mean": 0.9,
    "actor/lr": 1e-6,
    "actor/pg_loss": 0.12,
}


def test_an_a3_step_reads_as_documented() -> None:
    times = [900.0] * 11 + [859.68]
    line = step_line(A3_STEP, 12, 70, times, 2 * 3600 + 51 * 60)
    assert line == (
        "[step 12/70] ETA 14h30m (2h51m in) | 123 tok/s/card | reward 0.412 | val 0.503 | resp 1577 | "
        "mismatch 2.1e-03 | graph 99.1% | 860s: gen 391 (sync 17.0) ref 144 update 319 test 391 save 960"
    )
    assert len(line) < 200  # verl's console line for the same step is ~1.5 KB
    docs = " ".join(docs_text.text().split())
    assert f"`{line}`" in docs  # the A3 guide's example is this line, word for word
    assert "grep -F '[step ' LOG_DIR/<run>/trainer.log" in docs and PREFIX == "[step "


def test_a_missing_metric_is_left_out_and_a_bad_one_is_shown() -> None:
    line = step_line({"critic/score/mean": float("nan"), ABS_DIFF: float("inf")}, 3, 60, [], 10.0)
    assert line == "[step 3/60] | reward nan | mismatch inf"
    assert "ETA" not in line and "tok/s" not in line and "val" not in line and "graph" not in line


def test_validation_before_training_is_a_line_of_its_own() -> None:
    line = step_line({"val-core/deepscaler/reward/mean@1": 0.12}, 0, 70, [], 30.0)
    assert line == "[step 0/70] | val 0.120"


def test_verls_per_worker_throughput_when_ours_is_absent() -> None:
    assert "61.6 tok/s/worker" in step_line({"perf/throughput": 61.58}, 1, 2, [1.0], 1.0)
    both = step_line({"perf/throughput": 61.58, CARD_THROUGHPUT_KEY: 123.16}, 1, 2, [1.0], 1.0)
    assert "123 tok/s/card" in both and "worker" not in both


def test_several_validation_sources_are_named_and_capped() -> None:
    metrics = {f"val-core/src{i}/acc/mean@4": i / 10 for i in range(5)}
    line = step_line(metrics, 10, 20, [1.0], 10.0)
    assert "val src0 0.000 src1 0.100 src2 0.200 +2 more" in line


def test_the_old_log_prob_pass_and_the_critic_show_when_they_ran() -> None:
    line = step_line(
        {"timing_s/step": 2.0, "timing_s/old_log_prob": 0.5, "timing_s/update_critic": 0.25}, 1, 1, [2.0], 2.0
    )
    assert line.endswith("2.00s: old_log_prob 0.50 critic 0.25")


def test_values_of_any_numeric_type_and_junk() -> None:
    metrics = {
        "critic/score/mean": np.float64(0.25),
        "response_length/mean": np.int64(12),
        SHARE: "not a number",
        ABS_DIFF: [1, 2],
        "timing_s/gen": None,
    }
    line = step_line(metrics, 1, 1, [np.float32(1.5)], 1.5)
    assert line == "[step 1/1] ETA 0s (2s in) | reward 0.250 | resp 12.0"


@pytest.mark.parametrize(
    "seconds, text",
    [
        (0, "0s"),
        (59.4, "59s"),
        (60, "1m00s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (86399, "23h59m"),
        (86400, "1d00h"),
        (7 * 86400 + 5 * 3600, "7d05h"),
        (999 * 86400, ">999d"),
        (1e300, ">999d"),
        (-5, "0s"),
        (float("nan"), "nan"),
        (float("inf"), "inf"),
    ],
)
def test_durations(seconds: float, text: str) -> None:
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize(
    "x, text",
    [
        (0, "0.00"),
        (0.123456, "0.12"),
        (9.94, "9.94"),
        (9.96, "10.0"),
        (99.4, "99.4"),
        (99.6, "100"),
        (123456.7, "123457"),
        (9_999_999, "9999999"),
        (1e7, "1.0e+07"),
        (-3e300, "-3.0e+300"),
        (-3.0, "-3.00"),
        (float("nan"), "nan"),
        (float("-inf"), "-inf"),
    ],
)
def test_amounts_take_exponent_form_only_when_huge(x: float, text: str) -> None:
    assert fmt_amount(x) == text


def test_eta_is_the_median_step_time_times_the_steps_left() -> None:
    # one slow step (a save) does not move the median
    assert eta_seconds(3, 10, [10.0, 11.0, 1000.0]) == 11.0 * 7
    assert eta_seconds(10, 10, [10.0]) == 0.0
    assert eta_seconds(12, 10, [10.0]) == 0.0  # past the end (a resumed run with a shorter total)
    assert eta_seconds(1, 10, [float("nan"), -1.0]) is None
    assert eta_seconds(1, 0, [1.0]) is None


def test_every_field_at_its_widest_stays_within_the_bound() -> None:
    huge = -1.2345e300
    metrics = {key: huge for key in KNOWN} | {f"timing_s/{name}": huge for name, _ in PHASES}
    metrics |= {f"val-core/{i}{'x' * 60}/reward/mean@1": huge for i in range(12)}
    line = step_line(metrics, 10**10 - 2, 10**10 - 1, [1e300], 1e300)
    assert "ETA >999d (>999d in)" in line and "+10 more" in line and len(line) <= MAX_LENGTH


KNOWN = (
    "critic/score/mean",
    "response_length/mean",
    "perf/throughput",
    CARD_THROUGHPUT_KEY,
    ABS_DIFF,
    SHARE,
    "timing_s/step",
    "timing_s/gen",
    "timing_s/reshard",
    "timing_s/ref",
    "timing_s/update_actor",
    "timing_s/old_log_prob",
    "timing_s/update_critic",
    "timing_s/save_checkpoint",
    "timing_s/testing",
    "val-core/deepscaler/reward/mean@1",
)
values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-(10**12), 10**12),
    st.none(),
    st.text(max_size=5),
)
names = st.one_of(st.sampled_from(KNOWN), st.text(max_size=40))


@settings(max_examples=300, deadline=None)
@given(
    metrics=st.dictionaries(names, values, max_size=25),
    step=st.integers(0, 10**6),
    total=st.integers(-5, 10**6),
    times=st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=20),
    elapsed=st.floats(allow_nan=True, allow_infinity=True),
)
def test_any_metrics_give_one_short_line_that_no_console_parser_reads(
    metrics: dict, step: int, total: int, times: list[float], elapsed: float
) -> None:
    line = step_line(metrics, step, total, times, elapsed)
    assert line.startswith(f"{PREFIX}{step}") and "\n" not in line and "\r" not in line
    assert run_metrics.STEP_LINE.search(line) is None and run_metrics.parse_console(line) == {}
    assert len(line) <= MAX_LENGTH
    for key, word in (("critic/score/mean", "reward "), ("response_length/mean", "resp "), (SHARE, "graph ")):
        value = metrics.get(key)
        shown = isinstance(value, (int, float)) and not isinstance(value, bool)
        assert (word in line) == shown, (key, value, line)


@settings(max_examples=200, deadline=None)
@given(
    source=st.text(min_size=1, max_size=60).filter(lambda s: "/" not in s),
    value=st.floats(0, 1),
)
def test_a_data_source_name_cannot_forge_a_console_step(source: str, value: float) -> None:
    metrics = {f"val-core/{source}/reward/mean@1": value, "val-core/a/reward/mean@1": value}
    line = step_line(metrics, 1, 2, [1.0], 1.0)
    assert run_metrics.STEP_LINE.search(line) is None
    assert re.search(r"val \S+ \d\.\d{3} \S+ \d\.\d{3}$|val \d\.\d{3}$", line), line


@settings(max_examples=200, deadline=None)
@given(
    times=st.lists(st.floats(0.001, 1e5), min_size=1, max_size=30),
    step=st.integers(1, 500),
    left=st.integers(0, 500),
)
def test_the_eta_shown_is_the_median_times_the_steps_left(times: list[float], step: int, left: int) -> None:
    line = step_line({}, step, step + left, times, 0.0)
    assert f"ETA {fmt_duration(statistics.median(times) * left)} (0s in)" in line
    assert math.isclose(eta_seconds(step, step + left, times), statistics.median(times) * left)
