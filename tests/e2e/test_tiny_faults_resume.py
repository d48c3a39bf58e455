"""README command 1 (the tiny A3-path run: verl's Megatron actor/ref on MindSpeed, 4 Ray workers, vllm-ascend's
engine, our weight sync, the D2D cache) through the faults a cluster meets, with `--max-restarts 3`: ONE launch
gets through a hang and a killed worker by itself, then a scheduler's kill of the whole job is resumed by the same
command. One checkpoint folder (a checkpoint every step, keep the last 2), `STEPS` steps, no validation,
`VERL_PATCHES_COLLECTIVE_TIMEOUT_S` shortened to `TIMEOUT_S`:

Launch A (`--max-restarts 3`):
  run 1  starts fresh; rank 2 stops itself (SIGSTOP, `VERL_PATCHES_INJECT_STOP=2:update:3`) entering the update of
         step 3. The driver names it (hang report), the trainer exits, the launcher ends what it left and says
         `restart 1/3 after a hang of rank 2 (node ..., pid P) in update of step 3; resuming from step 2 in 10 s`;
         no worker of the run is left when it says so.
  run 2  resumes from step 2; rank 1 kills itself (SIGKILL, `VERL_PATCHES_INJECT_KILL=1:generate:5`) entering the
         generation of step 5: `restart 2/3 after the death of rank 1 (node ..., pid Q) in generate of step 5;
         resuming from step R in 20 s`, R = 3 while step 4's save, written in the background, is committed only at
         the fence before step 5's update (`overlay.async_checkpoint`), 4 with saves in the foreground.
  run 3  resumes from step R (each injection fires once per run folder, so the same environment gets past it);
         once step 5 is logged the WHOLE job is SIGKILLed, as a scheduler does: the launcher, the trainer and its
         local Ray cluster, and none survives. Step 5's save is then in flight (committed at step 6's fence, if
         the kill lands after it): the commit before it stays intact.
Launch B (the same command, without the faults, saving in the foreground): resumes from the last committed step
(4 or 5) and runs to the end with status 0; checkpoints 6 and 7 remain. Exactly two restarts: one line each,
naming cause, node and step. The time each save blocks its step is compared both ways (launch A's background
saves, launch B's foreground ones) and printed.

The uninterrupted reference is the session's 60-step run of the same command (conftest.py `a3_run`): every
step any run logs must reproduce that run's step. Comparable because nothing before step `STEPS` of the
reference depends on what differs here: verl v0.4.0's Megatron optimizer has no LR schedule (constant lr,
so `total_training_steps` changes nothing), the reference's validations (the base model's before step 1,
then after step 20's update) decode greedily, drawing nothing from the sampling stream and changing no
weight (so `test_freq=-1` and `val_before_train=False` here change nothing), the checkpoint writes only
read state, and the time-out, the restarts and the injection switches change no number. Run 1's steps (fresh
start, saving) check that; the resumed runs' steps check that the resume restores everything a step depends
on: actor weights and distributed-optimizer state (Adam moments and step), Megatron's and torch's RNG and
the rollout's sampling stream (verl_patches.checkpoint.rng) and the dataloader position, after a hang, a dead
worker and a killed job.

Compared per step: the reward mean, the policy-gradient and KL losses, the actor's KL to the rollout
policy, the gradient norm, the response length and the rollout/training log-prob mismatch (mean and max):
values that a different sample, weight, optimizer moment or prompt changes. On the console's 3-decimal values
within one unit of the last digit (the print's rounding); on the TensorBoard scalars (float32) of both launches
bit for bit: the same seed on the same CPU ops gives the same numbers, while a resume that lost any state
differs by far more (one different sample moves the reward mean by 1/256; measured: a resume from step 9 whose
rollout sampling stream started over from its seed logged reward means 0.223 and 0.285 for steps 10 and 11
where the uninterrupted run has 0.195 and 0.355).

One chain: every trainer start costs about a minute and a quarter on 2 cores. Restarts inside one launch pay
the trainer's start (its local Ray cluster included: the tiny run's Ray lives in the trainer's session and is
ended with it), not the launcher's; the chain starts the trainer 4 times (5 separate launches before restarts
existed). The restart policy's rules are tests/launch/test_restart_policy.py's; the loop through the launcher
with a stand-in trainer (the same step failing twice, a refusal) tests/launch/test_restarts.py's; a worker that
dies is named at once through a real verl RayWorkerGroup in tests/resilience/test_ray_worker_deadline.py; a
rank SIGKILLed while saving is tests/checkpoint/test_kill_resume.py's.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from pathlib import Path

import psutil
import pytest

import tiny_job
from tiny_job import RESUME_PREFIX, TinyJob, TinyRun, parse_steps, resume_lines, step_order

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiproc,
    pytest.mark.timeout(4200),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]

STEPS, KEEP, MAX_RESTARTS = 7, 2, 3
TIMEOUT_S = 20
STOP = (2, "update", 3)  # run 1: (rank, phase, step) of the stop
KILL = (1, "generate", 5)  # run 2: of the kill
KILL_JOB_AFTER = 5  # run 3: the step logged when the whole job is killed
LAUNCH_TIMEOUT_S = 1500  # to a fault, the kill point or the end, on a loaded 2-core host
EXIT_SLACK_S = 60  # the driver's look interval, the flight of the last marks, Ray's and the launcher's teardown
INJECTED = r"verl_patches fault injection: rank {rank} {verb} itself \({sig}, pid (\d+)\)"
RESTART = (
    r"\] restart {n}/{max} after {what} of rank {rank} \(node ([^,()]+), pid {pid}\) in {phase} of step {step}; "
    r"resuming from step (\d+) in {delay} s"
)
COMPARED = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/kl_loss",
    "actor/ppo_kl",
    "actor/grad_norm",
    "response_length/mean",
    "rollout_mismatch/logprob_abs_diff_mean",
    "rollout_mismatch/logprob_abs_diff_max",
)
BLOCKING, FENCE = "timing_s/save_checkpoint_blocking", "timing_s/save_checkpoint_fence"
CONSOLE_TOL = 1e-3 + 1e-9  # one unit of the console's last printed digit


def overrides(ckpt: Path, background: bool) -> tuple[str, ...]:
    return (
        f"overlay.async_checkpoint={background}",
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        f"trainer.max_actor_ckpt_to_keep={KEEP}",
        f"trainer.default_local_dir={ckpt}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )


def launch(monkeypatch: pytest.MonkeyPatch, log_dir: Path, assets: Path, ckpt: Path, faults: bool) -> TinyJob:
    """The same command both times; only launch A's environment carries the faults (each fires once per run
    folder, and launch B's is a new one: it may run step 5 again). Launch A saves in the background as the A3
    profiles do, launch B in the foreground: the time a save blocks the step, measured both ways in one test."""
    env = dict(tiny_job.env_for_run(), VERL_PATCHES_COLLECTIVE_TIMEOUT_S=str(TIMEOUT_S))
    for name in ("VERL_PATCHES_RUN_DIR", "VERL_PATCHES_INJECT_STOP", "VERL_PATCHES_INJECT_KILL"):
        env.pop(name, None)
    if faults:
        env["VERL_PATCHES_INJECT_STOP"] = ":".join(map(str, STOP))
        env["VERL_PATCHES_INJECT_KILL"] = ":".join(map(str, KILL))
    with monkeypatch.context() as m:
        m.setattr(tiny_job, "env_for_run", lambda: env)
        flags = ("--max-restarts", str(MAX_RESTARTS))
        return TinyJob(log_dir, assets, overrides(ckpt, background=faults), launcher_flags=flags)


def checkpoints(ckpt: Path) -> list[str]:
    return sorted((p.name for p in ckpt.iterdir() if p.is_dir()), key=lambda n: (len(n), n)) if ckpt.is_dir() else []


def committed(ckpt: Path) -> int:
    from verl_patches.checkpoint.commit import find_resume

    point = find_resume(ckpt)
    return point.step if point is not None else 0


def gone(pid: int, settle_s: float = 10.0) -> bool:
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def runs(output: str) -> list[str]:
    """A launch's output cut into its trainer runs: each run prints one resume line first."""
    starts = [m.start() for m in re.finditer(re.escape(RESUME_PREFIX), output)]
    return [output[a:b] for a, b in zip(starts, [*starts[1:], len(output)])]


def tensorboard_files(folder: Path) -> list[dict[int, dict[str, float]]]:
    """Each event file's scalars on its own (one per trainer run): a step a later run logged again is checked in
    both, not only in the merged view where the later one wins."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = []
    for events in sorted(folder.rglob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        steps: dict[int, dict[str, float]] = {}
        for tag in acc.Tags().get("scalars", []):
            for ev in acc.Scalars(tag):
                steps.setdefault(int(ev.step), {})[tag] = float(ev.value)
        out.append(steps)
    return out


def assert_same_as_reference(
    ref: dict[int, dict[str, float]],
    got: dict[int, dict[str, float]],
    tol_abs: float,
    what: str,
    partial: bool = False,
) -> None:
    """Every compared metric of every step in ``got`` equal to the reference's (``partial``: those it has)."""
    for step, metrics in sorted(got.items()):
        for key in COMPARED:
            if partial and key not in metrics:
                continue
            assert key in metrics and key in ref[step], (what, step, key, sorted(metrics))
            a, b = ref[step][key], metrics[key]
            same = a == b if tol_abs == 0 else math.isclose(a, b, rel_tol=0.0, abs_tol=tol_abs)
            assert same, f"{what}: step {step} {key}: {b!r}, uninterrupted run {a!r}"


def test_one_launch_restarts_itself_through_a_hang_and_a_killed_worker_and_a_killed_job_resumes(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    a3_run: TinyRun,
    tiny_a3_assets: Path,
    tmp_path: Path,
) -> None:
    from verl_patches.driver.run_metrics import read_tensorboard

    assert a3_run.returncode == 0, a3_run.output[-6000:]
    assert a3_run.run_dir is not None
    ref_tb = read_tensorboard(a3_run.run_dir / "tensorboard")
    ckpt = tmp_path / "ckpt"
    timings: list[str] = []
    t0 = time.monotonic()

    # Launch A: a hang, a dead worker, each restarted by the launcher; then the whole job killed by a scheduler
    job = launch(monkeypatch, tmp_path / "launchA", tiny_a3_assets, ckpt, faults=True)
    try:
        rank, phase, step = STOP
        stopped_pid = int(job.wait_for(INJECTED.format(rank=rank, verb="stops", sig="SIGSTOP"), LAUNCH_TIMEOUT_S)[1])
        stopped = time.monotonic()
        first = job.wait_for(
            RESTART.format(
                n=1, max=MAX_RESTARTS, what="a hang", rank=rank, pid=stopped_pid, phase=phase, step=step, delay=10
            ),
            TIMEOUT_S + EXIT_SLACK_S,
        )
        restarted = time.monotonic()
        left = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in job.workers()]  # the backoff's 10 s: none started
        assert gone(stopped_pid), f"the stopped worker {stopped_pid} outlived its run"
        assert not left, f"workers of the hung run left when the launcher restarted: {left}"
        timings.append(f"run 1: stopped after {stopped - t0:.0f} s, restart line {restarted - stopped:.0f} s later")

        rank, phase, step = KILL
        killed_pid = int(job.wait_for(INJECTED.format(rank=rank, verb="kills", sig="SIGKILL"), LAUNCH_TIMEOUT_S)[1])
        killed = time.monotonic()
        second = job.wait_for(
            RESTART.format(
                n=2, max=MAX_RESTARTS, what="the death", rank=rank, pid=killed_pid, phase=phase, step=step, delay=20
            ),
            EXIT_SLACK_S,
        )
        left = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in job.workers()]
        assert not left, f"workers of the run with the dead worker left when the launcher restarted: {left}"
        line_after = time.monotonic() - killed
        timings.append(f"run 2: worker killed after {killed - restarted:.0f} s, restart line {line_after:.0f} s later")

        job.wait_for(rf"step:{KILL_JOB_AFTER} - ", LAUNCH_TIMEOUT_S)  # not logged before run 3
        count = job.kill()
        left = job.survivors()
        out_a = job.output
    finally:
        job.close()
    timings.append(f"run 3: {count} processes of the job killed once step {KILL_JOB_AFTER} was logged")
    t0 = time.monotonic()
    assert not left, f"processes of the killed job survived: {left}"
    # where each run resumed: the update's fence commits the step before it (a save is written in the background
    # and committed before the next update), so a fault in the update of step N resumes from N-1 and one before it
    # from N-1 or N-2 (N-2 while step N-1's save is still uncommitted); the whole-job kill, likewise, from the step
    # it had logged or the one before (its save in flight: the previous commit stays intact)
    resumed = [STOP[2] - 1, int(second[2])]
    assert int(first[2]) == resumed[0], first[0]
    assert resumed[1] in (KILL[2] - 2, KILL[2] - 1), second[0]
    resumed.append(committed(ckpt))
    assert resumed[2] in (KILL_JOB_AFTER - 1, KILL_JOB_AFTER), (resumed, checkpoints(ckpt))
    assert first[1] == second[1], (first[0], second[0])  # one node
    restart_lines = [line for line in out_a.splitlines() if re.search(r"\] restart \d+/", line)]
    assert len(restart_lines) == 2, restart_lines  # a bounded number of restarts: exactly the two faults
    assert "stopped restarting" not in out_a and "not restarting" not in out_a

    # Launch B: the same command, to the end
    final = launch(monkeypatch, tmp_path / "launchB", tiny_a3_assets, ckpt, faults=False)
    try:
        rc = final.wait(LAUNCH_TIMEOUT_S)
        assert not final.survivors(), final.describe()
        out_b = final.output
        run_b = final.run_dir
    finally:
        final.close()
    timings.append(f"launch B: from step {resumed[2]} to the end in {time.monotonic() - t0:.0f} s")
    assert rc == 0, out_b[-6000:]
    assert not [line for line in out_b.splitlines() if re.search(r"\] restart \d+/", line)], out_b[-3000:]
    print("faults and restarts: " + "; ".join(timings))

    # one resume line per run, each from the checkpoint the launcher named; the steps each run logged
    runs_a, runs_b = runs(out_a), runs(out_b)
    assert len(runs_a) == 3 and len(runs_b) == 1, (resume_lines(out_a), resume_lines(out_b))
    assert runs_a[0].startswith(f"{RESUME_PREFIX} starting from step 0 (no complete checkpoint under")
    for run, start in zip([*runs_a[1:], *runs_b], resumed):
        assert run.startswith(f"{RESUME_PREFIX} from {ckpt / f'global_step_{start}'} (step {start};"), run[:300]
        assert "model, optimizer, RNG and dataloader restored" in run.splitlines()[0]
    ends = [STOP[2] - 1, KILL[2] - 1]
    for run, start, end in zip(runs_a[:2], [0, resumed[0]], ends):
        assert step_order(run) == list(range(start + 1, end + 1)), (start, end, step_order(run))
    order3 = step_order(runs_a[2])
    assert order3[: KILL_JOB_AFTER - resumed[1]] == list(range(resumed[1] + 1, KILL_JOB_AFTER + 1)), order3
    assert set(order3) <= set(range(resumed[1] + 1, KILL_JOB_AFTER + 2)), order3  # killed in step 6 at the latest
    assert step_order(runs_b[0]) == list(range(resumed[2] + 1, STEPS + 1)), step_order(runs_b[0])
    assert checkpoints(ckpt) == [f"global_step_{STEPS - 1}", f"global_step_{STEPS}"], checkpoints(ckpt)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)

    # every logged step reproduces the uninterrupted run's: the console's rounding, every event file's bits
    for n, run in enumerate([*runs_a, *runs_b], start=1):
        assert_same_as_reference(a3_run.steps, parse_steps(run), CONSOLE_TOL, f"run {n} (console)")
    run_a = next((tmp_path / "launchA").glob("tiny-*-local-*"))
    assert run_b is not None
    files_a, files_b = tensorboard_files(run_a / "tensorboard"), tensorboard_files(run_b / "tensorboard")
    assert len(files_a) == 3 and len(files_b) == 1, (len(files_a), len(files_b))
    logged = [sorted(s for s in f if s <= STEPS) for f in [*files_a, *files_b]]
    # the runs that ended by themselves wrote every step they logged; the SIGKILLed one what reached its file
    assert logged[:2] == [list(range(1, ends[0] + 1)), list(range(resumed[0] + 1, ends[1] + 1))], logged
    assert set(logged[2]) <= set(order3) and logged[3] == list(range(resumed[2] + 1, STEPS + 1)), logged
    for n, steps in enumerate([*files_a, *files_b], start=1):
        assert_same_as_reference(
            ref_tb, {s: m for s, m in steps.items() if s <= STEPS}, 0.0, f"run {n} (TensorBoard)", partial=n == 3
        )
    # the time each save stood the step still: launch A's background saves (the snapshot, then the fence's wait
    # for what the write had not finished) and launch B's foreground saves (the whole write)
    blocked = {
        way: [m[BLOCKING] for f in files for s, m in f.items() if s <= STEPS and BLOCKING in m]
        for way, files in (("background", files_a[:2]), ("foreground", files_b))
    }
    assert len(blocked["background"]) >= 3 and len(blocked["foreground"]) >= 2, blocked
    assert any(FENCE in m for f in files_a[:2] for m in f.values()), "no background save was fenced"
    assert not any(FENCE in m for f in files_b for m in f.values()), "a foreground save was fenced"
    with capsys.disabled():  # a measurement the suite's log keeps, passed or not
        print(
            "\ncheckpoint blocking time per save (tiny run, median): "
            + ", ".join(f"{way} {statistics.median(v):.3f} s over {len(v)} saves" for way, v in blocked.items())
        )
    print(
        f"faults and restarts: steps 1-{STEPS} in 4 trainer runs (resumed from {resumed}) equal the uninterrupted "
        "run's, bit for bit on TensorBoard"
    )
