"""Golden-metrics check (issue 15 item 4) on synthetic runs written the way a real run writes them:
TensorBoard scalars through torch's SummaryWriter (what verl's tracking uses), console step lines, and
rank_memory.jsonl from the fit loop's per-rank probe."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verl_patches.cpu_proof import golden
from verl_patches.driver import rank_memory, run_metrics
from verl_patches.worker_calls.logprob_mismatch import ABS_DIFF, RATIO_DEV

STEPS = 30


def write_run(
    folder: Path,
    reward_shift: float = 0.0,
    mem: dict[int, float] | None = None,
    mismatch: float = 2e-4,
    step_time: float = 1.0,
    console_only: bool = False,
    steps: int = STEPS,
    val_rise: float | None = 0.3,
    val_shift: float = 0.0,
    drift: float | None = 0.02,
    graph_share: float | None = 0.8,
) -> Path:
    """val_rise: validation at step 0 and every 10 steps, from 0.4 + val_shift rising linearly by this much;
    None: no validation. drift: the KL to the reference at step 10 and after (rising from 0 before); None:
    not logged. graph_share: the graph-decode share, 0.01 lower at every third step; None: not logged."""
    folder.mkdir(parents=True)
    rows = {}
    for s in range(1, steps + 1):
        rows[s] = {
            golden.REWARD_KEY: min(1.0, 0.05 + 0.02 * s) + reward_shift,
            ABS_DIFF: mismatch * (1 + 0.1 * (s % 3)),
            RATIO_DEV: mismatch * 1.01,
            golden.STEP_TIME_KEY: (3.0 if s == 1 else step_time),
        }
        if drift is not None:
            rows[s][golden.DRIFT_KEY] = drift * min(1.0, (s - 1) / 9)
        if graph_share is not None:
            rows[s][golden.GRAPH_SHARE_KEY] = graph_share - (0.01 if s % 3 == 0 else 0.0)
    if val_rise is not None:
        for s in range(0, steps + 1, 10):
            rows.setdefault(s, {})[golden.VAL_KEY] = 0.4 + val_shift + val_rise * s / STEPS
    if console_only:
        lines = [f"step:{s} - " + " - ".join(f"{k}:{v:.3f}" for k, v in m.items()) for s, m in rows.items()]
        (folder / "trainer.log").write_text("noise\n" + "\n".join(lines) + "\n")
    else:
        from torch.utils.tensorboard import SummaryWriter

        w = SummaryWriter(str(folder / "tensorboard"))
        for s, m in rows.items():
            for k, v in m.items():
                w.add_scalar(k, v, s)
        w.close()
    mem = {0: 1.0, 1: 1.2, 2: 0.9, 3: 1.1} if mem is None else mem
    for s in range(1, steps + 1):
        rank_memory.append(
            folder / rank_memory.FILE_NAME,
            s,
            [{"rank": r, "peak_gib": v * min(1.0, 0.5 + s / steps)} for r, v in mem.items()],
        )
    return folder


# three recorded runs: the reference, one a little lower and one a little higher (the run-to-run spread)
RECORDED = (
    (0.0, {0: 1.0, 1: 1.2, 2: 0.9, 3: 1.1}),
    (-0.03, {0: 0.98, 1: 1.19, 2: 0.9, 3: 1.08}),
    (0.02, {0: 0.99, 1: 1.18, 2: 0.88, 3: 1.1}),
)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("golden")
    runs = [
        write_run(
            root / f"base{i}",
            reward_shift=shift,
            mem=mem,
            val_shift=shift,
            drift=0.02 * (1 + shift),
            graph_share=0.8 + shift,
        )
        for i, (shift, mem) in enumerate(RECORDED)
    ]
    out = root / "baseline.json"
    assert golden.main([*map(str, runs), "--write-baseline", str(out), "--note", "synthetic"]) == 0
    return out


def check(tmp_path: Path, baseline: Path, *extra: str, **run_kw) -> tuple[int, dict]:
    run = write_run(tmp_path / "run", **run_kw)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = golden.main([str(run), "--check-against", str(baseline), "--json", *extra])
    return rc, json.loads(buf.getvalue())


def regressions(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c["status"] == "regression"]


def test_baseline_content(baseline: Path) -> None:
    doc = json.loads(baseline.read_text())
    assert doc["schema"] == 2 and doc["note"] == "synthetic" and len(doc["sources"]) == 3
    assert doc["reward"]["steps"] == list(range(1, STEPS + 1))
    windows = doc["reward"]["windows"]
    assert [w["steps"] for w in windows] == [[1, 10], [11, 20], [21, 30]]
    for w in windows:  # the band's floor is the lowest of the three runs' window means
        assert len(w["means"]) == 3 and w["floor"] == min(w["means"]) == pytest.approx(w["means"][0] - 0.03)
    assert doc["rank_peak_gib"] == {"0": 1.0, "1": 1.2, "2": 0.9, "3": 1.1}  # each rank's largest recorded peak
    assert doc["mismatch_max"][ABS_DIFF] == pytest.approx(2.4e-4, rel=1e-5)
    assert doc["step_time_median_s"] == pytest.approx(1.0)
    assert not list(baseline.parent.glob("*.tmp"))


def test_the_same_run_passes(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline)
    assert rc == 0 and rep["passed"] and regressions(rep) == []
    assert {c["metric"] for c in rep["checks"]} >= {
        golden.REWARD_KEY,
        "memory",
        ABS_DIFF,
        RATIO_DEV,
        golden.STEP_TIME_KEY,
    }


def test_small_noise_is_within_tolerance(tmp_path: Path, baseline: Path) -> None:
    rc, _ = check(tmp_path, baseline, reward_shift=-0.05, mem={0: 1.05, 1: 1.25, 2: 0.95, 3: 1.15}, mismatch=3e-4)
    assert rc == 0


def test_the_band_is_the_lowest_recorded_run_minus_the_tolerance(tmp_path: Path, baseline: Path) -> None:
    assert check(tmp_path / "in", baseline, reward_shift=-0.03 - 0.09)[0] == 0
    rc, rep = check(tmp_path / "out", baseline, reward_shift=-0.03 - 0.11)
    assert rc == 1 and "lowest recorded" in regressions(rep)[0]["message"]


def test_a_baseline_needs_three_runs(tmp_path: Path, capsys) -> None:
    runs = [write_run(tmp_path / f"r{i}") for i in range(2)]
    assert golden.main([*map(str, runs), "--write-baseline", str(tmp_path / "b.json")]) == 2
    assert "at least 3 runs" in capsys.readouterr().err and not (tmp_path / "b.json").exists()
    assert golden.main([*map(str, runs), "--check-against", str(tmp_path / "b.json")]) == 2
    assert "compares one run" in capsys.readouterr().err


def test_up_to_step_compares_the_windows_a_shorter_run_has(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, "--up-to-step", "20", steps=20)
    assert rc == 0 and [c["where"] for c in rep["checks"] if c["metric"] == golden.REWARD_KEY] == [
        "steps 1-10",
        "steps 11-20",
    ]
    rc, rep = check(tmp_path / "low", baseline, "--up-to-step", "20", steps=20, reward_shift=-0.2)
    assert rc == 1 and [c["where"] for c in regressions(rep)] == ["steps 1-10", "steps 11-20"]


def test_lower_reward_names_the_window(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, reward_shift=-0.2)
    assert rc == 1
    assert [c["where"] for c in regressions(rep)] == ["steps 1-10", "steps 11-20", "steps 21-30"]
    assert all(c["metric"] == golden.REWARD_KEY for c in regressions(rep))


def test_higher_reward_is_not_a_regression(tmp_path: Path, baseline: Path) -> None:
    assert check(tmp_path, baseline, reward_shift=0.3)[0] == 0


def test_missing_steps_are_a_regression(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, steps=20)
    assert rc == 1 and regressions(rep)[0]["where"] == "steps 21-30"


def test_memory_growth_names_the_rank(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, mem={0: 1.0, 1: 1.2, 2: 0.9, 3: 1.5})
    assert rc == 1 and [(c["metric"], c["where"]) for c in regressions(rep)] == [("memory", "rank 3")]
    rc, rep = check(tmp_path / "b", baseline, mem={0: 1.0, 1: 1.2})
    assert rc == 1 and regressions(rep)[0]["where"] == "ranks"


def test_mismatch_growth_is_a_regression(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, mismatch=1e-3)
    assert rc == 1 and {c["metric"] for c in regressions(rep)} == {ABS_DIFF, RATIO_DEV}
    assert regressions(rep)[0]["where"].startswith("step ")


def test_step_time_is_reported_and_gated_only_when_asked(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, step_time=2.0)
    st = [c for c in rep["checks"] if c["metric"] == golden.STEP_TIME_KEY][0]
    assert rc == 0 and st["status"] == "info" and "2.00x" in st["message"]
    rc, rep = check(tmp_path / "b", baseline, "--gate-step-time", step_time=2.0)
    assert rc == 1 and regressions(rep)[0]["metric"] == golden.STEP_TIME_KEY


def test_console_log_is_read_when_there_is_no_tensorboard(tmp_path: Path) -> None:
    run = golden.read_run(write_run(tmp_path / "r", console_only=True))
    assert run.source.endswith("trainer.log") and len(run.steps) == STEPS + 1  # and step 0's validation
    assert run.steps[30][golden.REWARD_KEY] == pytest.approx(0.65)


def test_bad_inputs_exit_2_naming_file_and_key(tmp_path: Path, baseline: Path, capsys) -> None:
    run = write_run(tmp_path / "r")
    assert golden.main([str(tmp_path / "nope"), "--check-against", str(baseline)]) == 2
    assert "not a run folder" in capsys.readouterr().err
    doc = json.loads(baseline.read_text())
    del doc["tolerances"]["reward_abs"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    assert golden.main([str(run), "--check-against", str(bad)]) == 2
    assert "'tolerances.reward_abs'" in capsys.readouterr().err
    doc = json.loads(baseline.read_text())
    doc["reward"]["windows"][1]["floor"] = "high"
    bad.write_text(json.dumps(doc))
    assert golden.main([str(run), "--check-against", str(bad)]) == 2
    assert "'reward.windows'" in capsys.readouterr().err
    bad.write_text("{\n oops")
    assert golden.main([str(run), "--check-against", str(bad)]) == 2
    assert "bad.json: line 2" in capsys.readouterr().err
    (run / rank_memory.FILE_NAME).write_text('{"step": 1}\n')
    assert golden.main([str(run), "--check-against", str(baseline)]) == 2
    assert "rank_memory.jsonl:1" in capsys.readouterr().err


def test_rank_memory_summary_and_run_dir() -> None:
    rows = [{"rank": 0, "peak_gib": 1.0}, {"rank": 1, "peak_gib": 3.0}, {"rank": 2, "peak_gib": 2.0}]
    assert rank_memory.summary_metrics(rows) == {
        "memory/peak_gib_max": 3.0,
        "memory/peak_gib_min": 1.0,
        "memory/peak_gib_mean": 2.0,
        "memory/peak_rank": 1.0,
    }
    assert rank_memory.run_dir({"TENSORBOARD_DIR": "/x/run/tensorboard"}) == Path("/x/run")
    assert rank_memory.run_dir({"VERL_PATCHES_RUN_DIR": "/y", "TENSORBOARD_DIR": "/x/t"}) == Path("/y")
    assert rank_memory.run_dir({}) is None
    p = rank_memory.probe()
    assert p["kind"] == "host" and p["peak_gib"] > 0 and p["current_gib"] > 0


@pytest.mark.multiproc
@pytest.mark.timeout(300)  # Ray start and two actors on a loaded 2-core host
def test_step_memory_probes_every_ray_worker(tmp_path: Path) -> None:
    """The probe runs inside each actor process through __ray_call__, as on verl's worker groups."""
    import os

    import ray

    from verl_patches.patching.ray_runtime import worker_pythonpath

    @ray.remote(num_cpus=0)
    class Worker:
        def ping(self) -> int:
            # a verl worker has torch and our modules loaded long before its first step ends; a bare actor
            # loads them here, untimed, so the hook's time limit measures the probe (on a loaded 2-core CI
            # host the first import alone took past that limit)
            from verl_patches.driver import rank_memory as _loaded  # noqa: F401

            return os.getpid()

    ray.init(
        address="local",
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": worker_pythonpath()}},
    )
    try:
        workers = [Worker.options(runtime_env={"env_vars": {"RANK": str(r)}}).remote() for r in range(2)]
        pids = ray.get([w.ping.remote() for w in workers])

        class Group:
            _workers = workers

        hook = rank_memory.StepMemory({"VERL_PATCHES_RUN_DIR": str(tmp_path)})
        metrics = hook(Group(), 1)
        rows = [json.loads(x) for x in (tmp_path / rank_memory.FILE_NAME).read_text().splitlines()]
        assert [r["rank"] for r in rows[0]["ranks"]] == [0, 1] and {r["pid"] for r in rows[0]["ranks"]} == set(pids)
        assert metrics["memory/peak_gib_max"] > 0 and metrics["memory/peak_rank"] in (0.0, 1.0)
        assert run_metrics.read_rank_memory(tmp_path / rank_memory.FILE_NAME).keys() == {0, 1}
    finally:
        ray.shutdown()


def test_golden_record_changes_only_the_seeds_and_needs_three_runs(capsys) -> None:
    from verl_patches.cpu_proof import golden_record

    assert golden_record.seed_overrides(0) == []  # README's command as is
    assert golden_record.seed_overrides(2) == ["data.seed=3", "+actor_rollout_ref.rollout.seed=2"]
    assert len({tuple(golden_record.seed_overrides(i)) for i in range(5)}) == 5
    assert golden_record.main(["--runs", "2"]) == 2 and "at least 3" in capsys.readouterr().err


# ---- validation ----------------------------------------------------------------------------------


def test_baseline_holds_validation_floors_and_the_smallest_rise(baseline: Path) -> None:
    val = json.loads(baseline.read_text())["validation"]
    assert val["key"] == golden.VAL_KEY and val["steps"] == [0, 10, 20, 30]
    assert val["floors"] == pytest.approx([0.37, 0.47, 0.57, 0.67])  # the lowest run (shift -0.03) each step
    assert val["rise_floor"] == pytest.approx(0.3) and len(val["rises"]) == 3


def test_validation_that_does_not_rise_fails_naming_the_rise(tmp_path: Path, baseline: Path) -> None:
    # above every step's floor at step 0, and still a regression: the 60 steps added nothing
    rc, rep = check(tmp_path, baseline, val_rise=0.0)
    bad = [c for c in regressions(rep) if c["metric"] == golden.VAL_KEY]
    assert rc == 1 and any(c["where"] == "rise, step 0 to 30" for c in bad), bad


def test_validation_below_a_floor_names_the_step(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, val_rise=0.1)  # 0.4 + 0.1 at step 30 < 0.67 - 0.1
    wheres = {c["where"] for c in regressions(rep) if c["metric"] == golden.VAL_KEY}
    assert rc == 1 and "step 30" in wheres and "step 0" not in wheres, wheres


def test_a_run_that_did_not_validate_fails_at_each_recorded_step(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, val_rise=None)
    wheres = [c["where"] for c in regressions(rep) if c["metric"] == golden.VAL_KEY]
    assert rc == 1 and wheres == ["step 0", "step 10", "step 20", "step 30"]


def test_a_partial_run_is_held_to_its_steps_and_to_not_falling(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path / "flat", baseline, "--up-to-step", "10", steps=10, val_rise=0.0, val_shift=-0.1)
    # step 10's floor is 0.47 - 0.1: a flat 0.30 fails it, but the rise check asks only that it did not fall
    wheres = {c["where"]: c["status"] for c in rep["checks"] if c["metric"] == golden.VAL_KEY}
    assert wheres == {"step 0": "ok", "step 10": "regression", "rise, step 0 to 10": "ok"}, wheres
    rc, rep = check(tmp_path / "ok", baseline, "--up-to-step", "20", steps=20)
    assert rc == 0, regressions(rep)


def test_a_baseline_without_validation_says_so(tmp_path: Path) -> None:
    runs = [write_run(tmp_path / f"r{i}", val_rise=None) for i in range(3)]
    doc = golden.make_baseline([golden.read_run(r) for r in runs])
    assert doc["validation"] is None
    checks = golden.compare_validation(golden.read_run(runs[0]), doc)
    assert [c.status for c in checks] == ["info"]


def older_baseline(baseline: Path, folder: Path, tolerance: str, section: str) -> tuple[dict, Path, dict]:
    """The baseline as recorded before `tolerance` and `section` existed: its document, file, and what loads."""
    doc = json.loads(baseline.read_text())
    del doc["tolerances"][tolerance], doc[section]
    old = folder / "old.json"
    old.write_text(json.dumps(doc))
    loaded = golden.load_baseline(old)
    assert loaded["tolerances"][tolerance] == golden.DEFAULT_TOLERANCES[tolerance]
    return doc, old, loaded


def test_a_baseline_recorded_before_validation_loads_with_the_default_tolerance(tmp_path: Path, baseline: Path) -> None:
    doc, old, loaded = older_baseline(baseline, tmp_path, "val_abs", "validation")
    assert [c.status for c in golden.compare_validation(golden.read_run(write_run(tmp_path / "r")), loaded)] == ["info"]
    doc["tolerances"]["val_abs"] = "0.1"
    old.write_text(json.dumps(doc))
    with pytest.raises(golden.GoldenInputError, match="tolerances.val_abs"):
        golden.load_baseline(old)


# ---- policy drift (KL to the reference) -------------------------------------------------------------


def test_baseline_holds_the_lowest_drift_of_each_window(baseline: Path) -> None:
    drift = json.loads(baseline.read_text())["drift"]
    assert drift["key"] == golden.DRIFT_KEY and drift["steps"] == list(range(1, STEPS + 1))
    assert [w["steps"] for w in drift["windows"]] == [[1, 10], [11, 20], [21, 30]]
    # the lowest run (0.97 x 0.02): steps 1-10 ramp from 0, so that window's mean is 0.55 of the plateau
    assert [w["floor"] for w in drift["windows"]] == pytest.approx([0.0194 * 0.5, 0.0194, 0.0194])


def test_a_policy_that_never_moves_fails_in_the_first_window(tmp_path: Path, baseline: Path) -> None:
    # a learning rate of 0: the actor stays the reference, its KL to it is 0 from the first step; the reward
    # of the first window is still the base model's, inside its band
    rc, rep = check(tmp_path / "lr0", baseline, "--up-to-step", "10", steps=10, drift=0.0, reward_shift=-0.05)
    assert rc == 1 and [(c["metric"], c["where"]) for c in regressions(rep)] == [(golden.DRIFT_KEY, "steps 1-10")]
    assert "moved away from the reference far less than in every recorded run" in regressions(rep)[0]["message"]
    rc, rep = check(tmp_path / "lr0-full", baseline, drift=0.0)
    assert rc == 1 and [c["where"] for c in regressions(rep) if c["metric"] == golden.DRIFT_KEY] == [
        "steps 1-10",
        "steps 11-20",
        "steps 21-30",
    ]


@pytest.mark.parametrize("scale, passes", [(0.3, True), (0.24, False), (5.0, True)])
def test_the_drift_band_is_a_factor_of_the_lowest_recorded_run(
    tmp_path: Path, baseline: Path, scale: float, passes: bool
) -> None:
    # 0.25 x the lowest run (0.97 x 0.02): a slower policy inside it passes, one below fails, a faster one passes
    rc, rep = check(tmp_path, baseline, drift=0.02 * 0.97 * scale / 0.99)
    assert (rc == 0) is passes, regressions(rep)


def test_a_run_that_did_not_log_its_drift_fails_and_a_baseline_without_drift_says_so(
    tmp_path: Path, baseline: Path
) -> None:
    rc, rep = check(tmp_path / "none", baseline, drift=None)
    assert rc == 1 and [c["metric"] for c in regressions(rep)] == [golden.DRIFT_KEY]
    assert "the run has no actor/kl_loss for 30 of the baseline's 30 steps" in regressions(rep)[0]["message"]
    # a baseline recorded before the drift check (or from runs without a KL loss) loads, and says it has none
    _, _, loaded = older_baseline(baseline, tmp_path, "drift_factor", "drift")
    run = golden.read_run(write_run(tmp_path / "r", drift=0.0))
    assert [c.status for c in golden.compare_drift(run, loaded)] == ["info"]
    runs = [golden.read_run(write_run(tmp_path / f"nodrift{i}", drift=None)) for i in range(3)]
    assert golden.make_baseline(runs)["drift"] is None


# ---- graph-decode share ---------------------------------------------------------------------------------------


def test_baseline_holds_the_lowest_graph_decode_share_of_any_step(baseline: Path) -> None:
    share = json.loads(baseline.read_text())["graph_share"]
    assert share["key"] == golden.GRAPH_SHARE_KEY
    assert share["floor"] == pytest.approx(0.8 - 0.03 - 0.01)  # the lowest run's lowest step


@pytest.mark.parametrize("share, passes", [(0.8, True), (0.73, True), (0.71, False), (0.3, False), (0.99, True)])
def test_a_run_whose_tokens_moved_to_eager_steps_fails(
    tmp_path: Path, baseline: Path, share: float, passes: bool
) -> None:
    # floor 0.76, tolerance 0.05: a lowest step of 0.72 passes, 0.70 fails
    rc, rep = check(tmp_path, baseline, graph_share=share)
    assert (rc == 0) is passes, regressions(rep)
    if not passes:
        (bad,) = regressions(rep)
        assert bad["metric"] == golden.GRAPH_SHARE_KEY and "eager steps" in bad["message"]


def test_a_run_without_the_share_fails_and_an_older_baseline_says_it_has_none(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path / "none", baseline, graph_share=None)
    assert rc == 1 and [c["metric"] for c in regressions(rep)] == [golden.GRAPH_SHARE_KEY]
    assert "which path made its tokens is unknown" in regressions(rep)[0]["message"]
    doc, old, loaded = older_baseline(baseline, tmp_path, "graph_share_abs", "graph_share")
    run = golden.read_run(write_run(tmp_path / "r", graph_share=None))
    assert [c.status for c in golden.compare_graph_share(run, loaded)] == ["info"]
    doc["graph_share"] = {"floor": 1.5}
    old.write_text(json.dumps(doc))
    with pytest.raises(golden.GoldenInputError, match="graph_share"):
        golden.load_baseline(old)


def test_a_non_finite_share_is_a_regression(tmp_path: Path, baseline: Path) -> None:
    rc, rep = check(tmp_path, baseline, graph_share=float("nan"))
    assert rc == 1 and golden.GRAPH_SHARE_KEY in {c["metric"] for c in regressions(rep)}


def test_golden_record_host_variants_plan_spread_and_identity(tmp_path: Path) -> None:
    from verl_patches.base import cpu_numerics
    from verl_patches.cpu_proof import golden_record

    plan = golden_record.host_variant_runs(tmp_path)
    assert [env for _, env, _ in plan[:2]] == [{}, {}] and [o for _, _, o in plan[:2]] == [[], []]  # as is, twice
    variants = plan[2:]
    assert [env for _, env, _ in variants] == [env for _, env in golden_record.HOST_VARIANTS]
    assert {k for _, env, _ in variants for k in env} <= set(cpu_numerics.PINS)  # only the kernel pins move
    dirs = [o[0] for _, _, o in variants]
    assert len(set(dirs)) == len(dirs) and all(d.startswith(f"overlay.tiny_assets_dir={tmp_path}/") for d in dirs)

    a, b = (golden.read_run(write_run(tmp_path / n)) for n in ("a", "b"))
    assert golden_record.identical_steps(a, b) is None  # the same run twice: every compared value equal
    c = golden.read_run(write_run(tmp_path / "c", reward_shift=0.001))
    assert golden_record.identical_steps(a, c).startswith("step 1 critic/score/mean")
    d = golden.read_run(write_run(tmp_path / "d", step_time=2.0))
    assert golden_record.identical_steps(a, d) is None  # the step time is not a result
    spread = golden_record.window_spread([a, c, golden.read_run(write_run(tmp_path / "e", reward_shift=-0.02))], 10)
    assert [(x, y) for x, y, _ in spread] == [(1, 10), (11, 20), (21, 30)]
    assert all(abs(s - 0.021) < 1e-6 for _, _, s in spread)  # TensorBoard keeps float32
