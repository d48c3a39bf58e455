"""README command 1 (the tiny A3-path run: verl's Megatron actor/ref on MindSpeed, TP2 x EP2, 4 Ray workers,
vllm-ascend's engine at rollout EP2, our weight sync, the D2D cache) through the faults a cluster meets,
launched again after each with the same command, one checkpoint folder (a checkpoint every step, keep the
last 2, `STEPS` steps, no validation), `VERL_PATCHES_COLLECTIVE_TIMEOUT_S` shortened to `TIMEOUT_S`:

1-3. one Ray worker stops itself (SIGSTOP, `VERL_PATCHES_INJECT_STOP=<rank>:<phase>:<step>`, after
     publishing its position) when it enters: generation of step 2, the update of step 3, the weight sync of
     step 4. Each time the launcher's last line names that rank (with node and pid), its phase and its
     step, the job exits non-zero within the time-out plus `EXIT_SLACK_S` of the stop, and no process of the
     job is left; the next launch resumes from the checkpoint before the stopped step (one line says so).
4.   resumes from step 3; once step 5 is logged (checkpoint 5 written) the WHOLE job is SIGKILLed, as a
     scheduler does: the launcher, the trainer and the local Ray cluster it started (every process in the
     job's sessions), and none survives. The kill lands in step 6, which writes the next checkpoint.
5.   resumes from step 5 and runs to the end with status 0; checkpoints 6 and 7 remain.

The uninterrupted reference is the session's 60-step run of the same command (conftest.py `a3_run`): every
step any launch logs must reproduce that run's step. Comparable because nothing before step `STEPS` of the
reference depends on what differs here: verl v0.4.0's Megatron optimizer has no LR schedule (constant lr,
so `total_training_steps` changes nothing), the reference's validations (the base model's before step 1,
then after step 20's update) decode greedily, drawing nothing from the sampling stream and changing no
weight (so `test_freq=-1` and `val_before_train=False` here change nothing), the checkpoint writes only
read state, and the time-out and the injection switch change no number. Launch 1's step (fresh start,
saving) checks that; the resumed launches' steps check that the resume restores everything a step depends
on: actor weights and distributed-optimizer state (Adam moments and step), Megatron's and torch's RNG and
the rollout's sampling stream (verl_patches.checkpoint.rng) and the dataloader position, after a stop in
each phase and after a kill.

Compared per step: the reward mean, the policy-gradient and KL losses, the actor's KL to the rollout
policy, the gradient norm, the response length and the rollout/training log-prob mismatch (mean and max):
values that a different sample, weight, optimizer moment or prompt changes. Tolerance: on the console's
3-decimal values one unit of the last digit (the print's rounding); on launch 5's TensorBoard scalars
(float32) REL_TOL 1e-5: the same seed on the same CPU ops gives the same numbers (measured: identical,
worst relative difference 0), while a resume that lost any state differs by far more (one different
sample moves the reward mean by 1/256; measured: a resume from step 9 whose rollout sampling stream started
over from its seed, as before it was saved, logged reward means 0.223 and 0.285 for steps 10 and 11 where
the uninterrupted run has 0.195 and 0.355).

One chain instead of a hang test and a kill test: every launch costs a start-up of about a minute and a
quarter on 2 cores, and each fault here also ends the launch before it. A worker that dies (rather than
stops) is named at once through a real verl RayWorkerGroup (tests/resilience/test_ray_worker_deadline.py);
a rank SIGKILLed while saving is tests/checkpoint/test_kill_resume.py's.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

import tiny_job
from tiny_job import TinyJob, TinyRun, parse_steps, resume_lines, step_order

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiproc,
    pytest.mark.timeout(4200),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]

STEPS, KEEP = 7, 2
TIMEOUT_S = 20
STOPS = ((1, "generate", 2), (2, "update", 3), (0, "weight_sync", 4))  # (rank, phase, step) of launches 1-3
CALL_OF = {"generate": "generate_sequences", "update": "update_actor", "weight_sync": "generate_sequences"}
KILL_JOB_AFTER = 5  # launch 4: logged step; checkpoint 5 exists by then
LAUNCH_TIMEOUT_S = 1500  # to the fault, the kill point or the end, on a loaded 2-core host
EXIT_SLACK_S = 60  # the driver's look interval, the flight of the last marks, Ray's and the launcher's teardown
STOP_LINE = r"verl_patches fault injection: rank {rank} stops itself \(SIGSTOP, pid (\d+)\)"
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
CONSOLE_TOL = 1e-3 + 1e-9  # one unit of the console's last printed digit
REL_TOL, ABS_TOL = 1e-5, 1e-7


def overrides(ckpt: Path) -> tuple[str, ...]:
    return (
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        f"trainer.max_actor_ckpt_to_keep={KEEP}",
        f"trainer.default_local_dir={ckpt}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )


def launch(monkeypatch: pytest.MonkeyPatch, log_dir: Path, assets: Path, ckpt: Path, inject: str | None) -> TinyJob:
    env = dict(tiny_job.env_for_run(), VERL_PATCHES_COLLECTIVE_TIMEOUT_S=str(TIMEOUT_S))
    env.pop("VERL_PATCHES_INJECT_STOP", None)
    if inject:
        env["VERL_PATCHES_INJECT_STOP"] = inject
    with monkeypatch.context() as m:  # the same command; only the environment carries the fault
        m.setattr(tiny_job, "env_for_run", lambda: env)
        return TinyJob(log_dir, assets, overrides(ckpt))


def checkpoints(ckpt: Path) -> list[str]:
    return sorted((p.name for p in ckpt.iterdir() if p.is_dir()), key=lambda n: (len(n), n)) if ckpt.is_dir() else []


def last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


def assert_same_as_reference(
    ref: dict[int, dict[str, float]], got: dict[int, dict[str, float]], tol_rel: float, tol_abs: float, what: str
) -> None:
    for step, metrics in sorted(got.items()):
        for key in COMPARED:
            assert key in metrics and key in ref[step], (what, step, key, sorted(metrics))
            a, b = ref[step][key], metrics[key]
            assert math.isclose(a, b, rel_tol=tol_rel, abs_tol=tol_abs), (
                f"{what}: step {step} {key}: {b!r}, uninterrupted run {a!r}"
            )


def assert_stop_named(out: str, rank: int, phase: str, step: int, pid: int) -> None:
    line = last_line(out)
    assert "verl_patches hang:" in line, out[-4000:]
    assert f"stuck: rank {rank} (node " in line and f", pid {pid}) stopped reporting " in line, line
    assert f"(process frozen or dead), last in phase '{phase}'" in line, line
    assert f"of step {step} in {CALL_OF[phase]}; its log: " in line, line
    assert line.count("verl_patches hang:") == 1 and f"(VERL_PATCHES_COLLECTIVE_TIMEOUT_S={TIMEOUT_S})" in line


def test_stops_in_each_phase_and_a_killed_job_are_resumed_by_the_same_command_reproducing_the_run(
    monkeypatch: pytest.MonkeyPatch, a3_run: TinyRun, tiny_a3_assets: Path, tmp_path: Path
) -> None:
    from verl_patches.trainer.golden import read_tensorboard

    assert a3_run.returncode == 0, a3_run.output[-6000:]
    assert a3_run.run_dir is not None
    ref_tb = read_tensorboard(a3_run.run_dir / "tensorboard")
    ckpt = tmp_path / "ckpt"
    outputs: list[str] = []
    timings: list[str] = []
    t0 = time.monotonic()

    # 1-3: a worker stops itself in generation, update, weight sync
    for n, (rank, phase, step) in enumerate(STOPS, start=1):
        job = launch(monkeypatch, tmp_path / f"launch{n}", tiny_a3_assets, ckpt, f"{rank}:{phase}:{step}")
        try:
            pid = int(job.wait_for(STOP_LINE.format(rank=rank), LAUNCH_TIMEOUT_S).group(1))
            stopped = time.monotonic()
            rc = job.wait(TIMEOUT_S + EXIT_SLACK_S)
            ended = time.monotonic()
            left = job.survivors()
            out = job.output
        finally:
            job.close()
        outputs.append(out)
        timings.append(f"launch {n}: stopped after {stopped - t0:.0f} s, ended {ended - stopped:.0f} s later")
        t0 = ended
        assert rc != 0, out[-4000:]
        assert ended - stopped <= TIMEOUT_S + EXIT_SLACK_S
        assert not left, f"processes of launch {n} left after it ended: {left}"
        assert_stop_named(out, rank, phase, step, pid)

    # 4: the whole job SIGKILLed in the step that writes the next checkpoint
    job = launch(monkeypatch, tmp_path / "launch4", tiny_a3_assets, ckpt, None)
    try:
        job.wait_for(rf"step:{KILL_JOB_AFTER} - ", LAUNCH_TIMEOUT_S)
        assert f"global_step_{KILL_JOB_AFTER}" in checkpoints(ckpt), checkpoints(ckpt)
        killed = job.kill()
        left = job.survivors()
        outputs.append(job.output)
    finally:
        job.close()
    timings.append(f"launch 4: {killed} processes killed after {time.monotonic() - t0:.0f} s")
    t0 = time.monotonic()
    assert not left, f"processes of the killed job survived: {left}"

    # 5: to the end
    final = launch(monkeypatch, tmp_path / "launch5", tiny_a3_assets, ckpt, None)
    try:
        rc = final.wait(LAUNCH_TIMEOUT_S)
        assert not final.survivors(), final.describe()
        outputs.append(final.output)
        run_dir = final.run_dir
    finally:
        final.close()
    timings.append(f"launch 5: to the end in {time.monotonic() - t0:.0f} s")
    assert rc == 0, final.output[-6000:]
    print("faults and resume: " + "; ".join(timings))

    # one resume line per launch, naming the checkpoint before each fault; the steps each launch logged
    assert "starting from step 0 (no complete checkpoint under" in resume_lines(outputs[0])[0]
    assert step_order(outputs[0]) == [1]
    for n, resumed_from in ((1, 1), (2, 2), (3, 3), (4, KILL_JOB_AFTER)):
        lines = resume_lines(outputs[n])
        assert len(lines) == 1 and lines[0].startswith(
            f"verl_patches resume: from {ckpt / f'global_step_{resumed_from}'} (step {resumed_from};"
        ), (n, lines)
        assert "model, optimizer, RNG and dataloader restored" in lines[0], lines
    assert step_order(outputs[1]) == [2] and step_order(outputs[2]) == [3], (outputs[1][-2000:], outputs[2][-2000:])
    order4 = step_order(outputs[3])
    assert order4[:2] == [4, KILL_JOB_AFTER] and set(order4) <= {4, 5, 6}, order4  # killed during step 6
    assert step_order(outputs[4]) == list(range(KILL_JOB_AFTER + 1, STEPS + 1)), step_order(outputs[4])
    assert checkpoints(ckpt) == [f"global_step_{STEPS - 1}", f"global_step_{STEPS}"], checkpoints(ckpt)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)

    # every logged step reproduces the uninterrupted run's
    for n, out in enumerate(outputs, start=1):
        assert_same_as_reference(a3_run.steps, parse_steps(out), 0.0, CONSOLE_TOL, f"launch {n} (console)")
    assert run_dir is not None
    tb5 = {s: m for s, m in read_tensorboard(run_dir / "tensorboard").items() if s <= STEPS}
    assert sorted(tb5) == list(range(KILL_JOB_AFTER + 1, STEPS + 1)), sorted(tb5)
    assert_same_as_reference(ref_tb, tb5, REL_TOL, ABS_TOL, "launch 5 (TensorBoard)")
    worst = max(abs(tb5[s][k] - ref_tb[s][k]) / max(abs(ref_tb[s][k]), 1e-30) for s in tb5 for k in COMPARED)
    print(
        f"faults and resume: steps {KILL_JOB_AFTER + 1}-{STEPS} vs the uninterrupted run: worst relative "
        f"difference {worst:.3g}"
    )
