"""The rollout-mismatch gate (issue 40, must-have 6): a warning and a stop threshold on rollout_mismatch/*.

`decide` is checked exhaustively against its definition; the keys are read by one function that the config
checks (and so the preflight, the dry run) and the fit loop share; the fit loop, run with fake workers whose
rollout and training log-probs differ by a known amount, warns once per step above the warning bound and
ends the run after the step above the stop bound is logged, with one line naming metric, value, bound and key.
The A3 profiles' defaults leave the tiny run's fp32 gap far below the warning."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from fit_fakes import STEPS, Recorder, fit_config, make_trainer  # the fit loop's fake workers
from verl_patches.driver import fit_loop, mismatch_gate
from verl_patches.driver.config_checks import check_config
from verl_patches.driver.mismatch_gate import (
    GATE_KEY,
    GATED,
    OK,
    STOP,
    WARN,
    GateConfigError,
    RolloutMismatchStop,
    Thresholds,
    decide,
    enforce,
    thresholds_from_config,
)
from verl_patches.driver.step_plan import StepPlan
from verl_patches.trainer.config_compose import compose_config, resolved
from verl_patches.worker_calls import logprob_mismatch

MEAN, RATIO, MAX = logprob_mismatch.ABS_DIFF, logprob_mismatch.RATIO_DEV, logprob_mismatch.ABS_DIFF_MAX
A3_PROFILES = ("a3_256die_true_weight", "a3_256die_random_init", "a3_16die_smoke")
# the tiny run's fp32 gap (README: at most 2.7e-7) and the fp32 pair of bench/bench_bf16_mismatch.py, rounded up
TINY_FP32 = {MEAN: 1e-6, RATIO: 1e-6, MAX: 1e-4}

values = st.one_of(st.floats(0, 10, allow_nan=False), st.just(math.nan), st.just(math.inf))
bounds = st.dictionaries(st.sampled_from(GATED), st.floats(1e-6, 5, allow_nan=False), max_size=3)


@settings(max_examples=400, deadline=None)
@given(metrics=st.dictionaries(st.sampled_from(GATED + ("actor/pg_loss",)), values), warn=bounds, stop=bounds)
def test_decide_is_stop_then_warn_then_ok(metrics: dict, warn: dict, stop: dict) -> None:
    def above(level: dict) -> set[str]:
        return {m for m, b in level.items() if m in metrics and not (metrics[m] <= b)}

    v = decide(metrics, Thresholds(warn=warn, stop=stop))
    if above(stop):
        assert v.action == STOP and {c.metric for c in v.crossings} == above(stop)
    elif above(warn):
        assert v.action == WARN and {c.metric for c in v.crossings} == above(warn)
    else:
        assert v.action == OK and v.crossings == ()
    for c in v.crossings:
        assert c.bound == (stop if v.action == STOP else warn)[c.metric]


def test_a_metric_the_step_did_not_report_is_not_judged() -> None:
    assert decide({"actor/pg_loss": 9.0}, Thresholds(warn={MEAN: 0.1}, stop={MEAN: 0.2})).action == OK


def test_absent_or_null_gate_is_no_gate() -> None:
    assert thresholds_from_config(OmegaConf.create({})) == Thresholds()
    assert thresholds_from_config(OmegaConf.create({"overlay": {"rollout_mismatch_gate": None}})) == Thresholds()


def gate_cfg(section: Any) -> Any:
    return OmegaConf.create({"overlay": {"rollout_mismatch_gate": section}})


def test_keys_read_into_full_metric_names() -> None:
    warn = {"logprob_abs_diff_mean": 0.1, "ratio_abs_dev_mean": None}
    t = thresholds_from_config(gate_cfg({"warn": warn, "stop": {"logprob_abs_diff_mean": 1}}))
    assert t == Thresholds(warn={MEAN: 0.1}, stop={MEAN: 1.0})


@pytest.mark.parametrize(
    "section, key",
    [
        ({"warn": {"logprob_abs_diff_mean": 0}}, f"{GATE_KEY}.warn.logprob_abs_diff_mean=0"),
        ({"warn": {"logprob_abs_diff_mean": -0.1}}, f"{GATE_KEY}.warn.logprob_abs_diff_mean=-0.1"),
        ({"stop": {"logprob_abs_diff_mean": "0.1"}}, f"{GATE_KEY}.stop.logprob_abs_diff_mean='0.1'"),
        ({"stop": {"logprob_abs_diff_mean": True}}, f"{GATE_KEY}.stop.logprob_abs_diff_mean=True"),
        ({"stop": {"ratio_abs_dev_mean": math.inf}}, f"{GATE_KEY}.stop.ratio_abs_dev_mean=inf"),
        ({"stop": {"ratio_abs_dev_mean": math.nan}}, f"{GATE_KEY}.stop.ratio_abs_dev_mean=nan"),
        ({"stop": {"tokens": 5}}, f"{GATE_KEY}.stop.tokens: not a gated metric"),
        ({"halt": {"logprob_abs_diff_mean": 1}}, f"{GATE_KEY}.halt: unknown level"),
        ({"warn": 0.1}, f"{GATE_KEY}.warn=0.1 must map"),
        (0.1, f"{GATE_KEY}=0.1: expected a mapping"),
        (
            {"warn": {"logprob_abs_diff_mean": 0.5}, "stop": {"logprob_abs_diff_mean": 0.2}},
            f"{GATE_KEY}.warn.logprob_abs_diff_mean=0.5 is above {GATE_KEY}.stop.logprob_abs_diff_mean=0.2",
        ),
    ],
)
def test_a_bad_setting_is_one_line_naming_its_key(section: Any, key: str) -> None:
    with pytest.raises(GateConfigError) as err:
        thresholds_from_config(gate_cfg(section))
    assert str(err.value).startswith(key) and "\n" not in str(err.value)


@pytest.fixture(scope="module")
def a3_cfgs() -> dict[str, Any]:
    return {p: resolved(compose_config("ppo_mindspeed_trainer", [f"profile={p}"])) for p in A3_PROFILES}


def test_the_a3_profiles_gate_both_levels_and_the_tiny_run_inherits_it(a3_cfgs: dict[str, Any]) -> None:
    gates = {p: thresholds_from_config(c) for p, c in a3_cfgs.items()}
    for profile, t in gates.items():
        assert t.warn and t.stop, profile
        assert MEAN in t.warn and MEAN in t.stop and t.warn[MEAN] < t.stop[MEAN]
    tiny = thresholds_from_config(resolved(compose_config("ppo_tiny_local", [])))
    assert tiny == gates["a3_256die_true_weight"]
    assert decide(TINY_FP32, tiny).action == OK


def test_config_checks_and_the_preflight_refuse_a_bad_threshold_with_the_same_words(a3_cfgs: dict[str, Any]) -> None:
    from verl_patches.launch.preflight.findings import FAIL
    from verl_patches.launch.preflight.layout import semantic_findings

    cfg = OmegaConf.create(OmegaConf.to_container(a3_cfgs["a3_256die_true_weight"]))
    assert not [p for p in check_config(cfg) if GATE_KEY in p]
    OmegaConf.update(cfg, f"{GATE_KEY}.stop.logprob_abs_diff_mean", -1.0)
    problems = [p for p in check_config(cfg) if GATE_KEY in p]
    want = f"{GATE_KEY}.stop.logprob_abs_diff_mean=-1.0 must be a positive finite number (or null: not gated)"
    assert problems == [want]
    found = [f for f in semantic_findings(cfg) if f.status == FAIL and GATE_KEY in f.message]
    assert [f.message for f in found] == problems


def test_enforce_says_nothing_warns_or_stops_in_one_line() -> None:
    said: list[str] = []
    t = Thresholds(warn={MEAN: 0.1, RATIO: 0.1}, stop={MEAN: 0.3})
    enforce(decide({MEAN: 0.05}, t), 4, said.append)
    assert said == []
    enforce(decide({MEAN: 0.2, RATIO: 0.25}, t), 5, said.append)
    assert said == [
        "verl_patches rollout mismatch warning at step 5: "
        f"{MEAN}=0.2 > 0.1 ({GATE_KEY}.warn.logprob_abs_diff_mean); "
        f"{RATIO}=0.25 > 0.1 ({GATE_KEY}.warn.ratio_abs_dev_mean)"
    ]
    with pytest.raises(RolloutMismatchStop) as err:
        enforce(decide({MEAN: 0.5, RATIO: 0.6}, t), 6, said.append)
    line = (
        f"verl_patches rollout mismatch stopping the run at step 6: "
        f"{MEAN}=0.5 > 0.3 ({GATE_KEY}.stop.logprob_abs_diff_mean)"
    )
    assert str(err.value) == line and said[-1] == line


@pytest.fixture(scope="module")
def fit_cfg() -> Any:
    """test_fit_loop's base config (its fake workers' batch sizes)."""
    return fit_config()


def run_with_gate(fit_cfg: Any, monkeypatch: pytest.MonkeyPatch, gate: dict) -> tuple[list[str], Any, Any]:
    """The fit loop (old-log-prob pass skipped: the actor reports the mismatch, 0.01 per token) with `gate`."""
    said: list[str] = []
    monkeypatch.setattr(fit_loop, "_say", said.append)
    plan = StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False)
    t, wg = make_trainer(fit_cfg, monkeypatch, plan, **{GATE_KEY: gate})
    return said, t, wg


def test_the_fit_loop_warns_once_per_step_above_the_warning(fit_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    said, t, wg = run_with_gate(fit_cfg, monkeypatch, {"warn": {"logprob_abs_diff_mean": 0.005}, "stop": None})
    fit_loop.run_fit(t, StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False))
    assert [s for s, _ in Recorder.logged] == list(range(1, STEPS + 1))
    assert said == [
        f"verl_patches rollout mismatch warning at step {s}: "
        f"{MEAN}=0.01 > 0.005 ({GATE_KEY}.warn.logprob_abs_diff_mean)"
        for s in range(1, STEPS + 1)
    ]


def test_the_fit_loop_stops_after_the_step_above_the_stop(fit_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    said, t, wg = run_with_gate(
        fit_cfg, monkeypatch, {"warn": {"logprob_abs_diff_mean": 0.001}, "stop": {"logprob_abs_diff_mean": 0.005}}
    )
    with pytest.raises(RolloutMismatchStop) as err:
        fit_loop.run_fit(t, StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False))
    line = (
        "verl_patches rollout mismatch stopping the run at step 1: "
        f"{MEAN}=0.01 > 0.005 ({GATE_KEY}.stop.logprob_abs_diff_mean)"
    )
    assert str(err.value) == line and said == [line]
    assert [s for s, _ in Recorder.logged] == [1]  # the step's metrics are logged, no further step runs
    assert wg.methods().count("generate_sequences") == 1


def test_below_both_bounds_the_fit_loop_says_nothing(fit_cfg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    said, t, wg = run_with_gate(
        fit_cfg, monkeypatch, {"warn": {"logprob_abs_diff_mean": 0.05}, "stop": {"logprob_abs_diff_mean": 0.5}}
    )
    fit_loop.run_fit(t, StepPlan(skip_old_log_prob=True, d2d=False, fused_role=False))
    assert said == [] and len(Recorder.logged) == STEPS
    assert mismatch_gate.decide(Recorder.logged[-1][1], thresholds_from_config(t.config)).action == OK
