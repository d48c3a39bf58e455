"""Kill and resume README command 1 (the tiny A3-path run: verl's Megatron actor/ref on MindSpeed, TP2 x EP2,
4 Ray workers, vllm-ascend's engine at rollout EP2, our weight sync), the same command every launch, with a
checkpoint every 2 steps (keep the last 2) and 8 steps in all:

1. launch 1 runs from scratch; once step 3 is logged (checkpoint 2 exists) ONE Ray worker process of verl's
   ActorRolloutRefWorker is SIGKILLed: the job ends by itself with an error, and leaves no process behind;
2. launch 2 resumes from step 2 (one line says so) and runs steps 3, 4, ...; once step 5 is logged
   (checkpoint 4 exists) the WHOLE job is SIGKILLed: the launcher, the trainer and the local Ray cluster
   it started (every process in the job's sessions), and none survives;
3. launch 3 resumes from step 4, runs steps 5 to 8 and ends with status 0; checkpoints 6 and 8 remain.

Each kill lands in the step that writes the next checkpoint (4, then 6), as it did with a checkpoint every 3
steps and 12 steps in all (kills after steps 5 and 8): every launch, kill and resume is the same, each resume
starts from the checkpoint before its kill and repeats the steps after it; the shorter schedule trains about
11 steps over the three launches instead of 17.

The uninterrupted reference is the session's 60-step run of the same command (conftest.py `a3_run`): every
step each launch logs must reproduce that run's step. Comparable because nothing before step 8 of the
reference depends on what differs here: verl v0.4.0's Megatron optimizer has no LR schedule (constant lr,
so `total_training_steps` 8 vs 60 changes nothing), the reference's validations (the base model's before step 1, then
after step 20's update) decode greedily, drawing nothing from the sampling stream and changing no weight (so
`test_freq=-1` and `val_before_train=False` here change nothing), and the checkpoint writes only read state.
Launch 1's steps (fresh start, saving) check that; the resumed launches' steps check that the resume
restores everything a step depends on: actor weights and distributed-optimizer state (Adam moments and
step), Megatron's and torch's RNG and the rollout's sampling stream (verl_patches.checkpoint.rng) and the
dataloader position.

Compared per step: the reward mean, the policy-gradient and KL losses, the actor's KL to the rollout
policy, the gradient norm, the response length and the rollout/training log-prob mismatch (mean and max):
values that a different sample, weight, optimizer moment or prompt changes. Tolerance: on the console's
3-decimal values one unit of the last digit (the print's rounding); on launch 3's TensorBoard scalars
(float32) REL_TOL 1e-5: the same seed on the same CPU ops gives the same numbers (measured: identical,
worst relative difference 0), while a resume that lost any state differs by far more (one different
sample moves the reward mean by 1/256; measured: a resume from step 9 whose rollout sampling stream started
over from its seed, as before it was saved, logged reward means 0.223 and 0.285 for steps 10 and 11 where
the uninterrupted run has 0.195 and 0.355).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from tiny_job import TinyJob, TinyRun, parse_steps, resume_lines, step_order

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiproc,
    pytest.mark.timeout(4200),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]

STEPS, SAVE_FREQ, KEEP = 8, 2, 2
KILL_WORKER_AFTER, KILL_JOB_AFTER = 3, 5  # logged steps; checkpoints 2 and 4 exist by then
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
LAUNCH_TIMEOUT_S = 1500  # to the kill point or the end, on a loaded 2-core host
EXIT_AFTER_WORKER_KILL_S = 300


def overrides(ckpt: Path) -> tuple[str, ...]:
    return (
        f"trainer.total_training_steps={STEPS}",
        f"trainer.save_freq={SAVE_FREQ}",
        f"trainer.max_actor_ckpt_to_keep={KEEP}",
        f"trainer.default_local_dir={ckpt}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )


def checkpoints(ckpt: Path) -> list[str]:
    return sorted((p.name for p in ckpt.iterdir() if p.is_dir()), key=lambda n: (len(n), n)) if ckpt.is_dir() else []


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


def run_launch(tmp: Path, name: str, assets: Path, ckpt: Path) -> TinyJob:
    return TinyJob(tmp / name, assets, overrides(ckpt))


def test_tiny_run_killed_twice_resumes_and_reproduces_the_uninterrupted_run(
    a3_run: TinyRun, tiny_a3_assets: Path, tmp_path: Path
) -> None:
    from verl_patches.trainer.golden import read_tensorboard

    assert a3_run.returncode == 0, a3_run.output[-6000:]
    ref_console = a3_run.steps
    assert a3_run.run_dir is not None
    ref_tb = read_tensorboard(a3_run.run_dir / "tensorboard")
    ckpt = tmp_path / "ckpt"
    t0 = time.monotonic()
    jobs: list[TinyJob] = []
    try:
        # 1. one worker SIGKILLed mid-run, after checkpoint 2
        first = run_launch(tmp_path, "launch1", tiny_a3_assets, ckpt)
        jobs.append(first)
        first.wait_for(rf"step:{KILL_WORKER_AFTER} - ", LAUNCH_TIMEOUT_S)
        assert "global_step_2" in checkpoints(ckpt), checkpoints(ckpt)
        victim = first.kill_one_worker()
        rc1 = first.wait(EXIT_AFTER_WORKER_KILL_S)
        t1 = time.monotonic()
        assert rc1 != 0, first.output[-4000:]
        left1 = first.survivors()
        assert not left1, f"processes of launch 1 left after it ended ({victim} killed): {left1}"
        out1 = first.output
        assert resume_lines(out1) and "starting from step 0 (no complete checkpoint under" in resume_lines(out1)[0]

        # 2. the whole job SIGKILLed mid-run, after checkpoint 4
        second = run_launch(tmp_path, "launch2", tiny_a3_assets, ckpt)
        jobs.append(second)
        second.wait_for(rf"step:{KILL_JOB_AFTER} - ", LAUNCH_TIMEOUT_S)
        assert "global_step_4" in checkpoints(ckpt), checkpoints(ckpt)
        killed = second.kill()
        left2 = second.survivors()
        t2 = time.monotonic()
        assert not left2, f"processes of the killed job survived: {left2}"
        out2 = second.output

        # 3. to the end
        third = run_launch(tmp_path, "launch3", tiny_a3_assets, ckpt)
        jobs.append(third)
        rc3 = third.wait(LAUNCH_TIMEOUT_S)
        t3 = time.monotonic()
        out3 = third.output
        assert rc3 == 0, out3[-6000:]
        assert not third.survivors(), third.describe()
    finally:
        for job in jobs:
            job.close()
    print(
        f"kill-resume: launch 1 {t1 - t0:.0f} s (killed {victim}), launch 2 {t2 - t1:.0f} s ({killed} processes "
        f"killed), launch 3 {t3 - t2:.0f} s; total {t3 - t0:.0f} s"
    )

    # one resume line per launch, naming the checkpoint and its step
    lines2, lines3 = resume_lines(out2), resume_lines(out3)
    assert len(resume_lines(out1)) == 1, resume_lines(out1)
    assert len(lines2) == 1 and lines2[0].startswith(f"verl_patches resume: from {ckpt / 'global_step_2'} (step 2;"), (
        lines2
    )
    assert len(lines3) == 1 and lines3[0].startswith(f"verl_patches resume: from {ckpt / 'global_step_4'} (step 4;"), (
        lines3
    )
    assert "model, optimizer, RNG and dataloader restored" in lines3[0], lines3

    # each launch logs consecutive steps from its resume point; only steps after the last checkpoint repeat
    order1, order2, order3 = step_order(out1), step_order(out2), step_order(out3)
    assert order1 == list(range(1, len(order1) + 1)) and len(order1) >= KILL_WORKER_AFTER, order1
    assert order2 == list(range(3, 3 + len(order2))) and order2[-1] >= KILL_JOB_AFTER, order2
    assert order3 == list(range(5, STEPS + 1)), order3
    assert set(order1) & set(order2) <= set(range(3, 5)) and set(order2) & set(order3) <= set(range(5, 7))
    assert sorted(set(order1) | set(order2) | set(order3)) == list(range(1, STEPS + 1))
    assert checkpoints(ckpt) == ["global_step_6", "global_step_8"], checkpoints(ckpt)
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)

    # every logged step reproduces the uninterrupted run's
    for name, out in (("launch 1", out1), ("launch 2", out2), ("launch 3", out3)):
        assert_same_as_reference(ref_console, parse_steps(out), 0.0, CONSOLE_TOL, f"{name} (console)")
    assert third.run_dir is not None
    tb3 = {s: m for s, m in read_tensorboard(third.run_dir / "tensorboard").items() if s <= STEPS}
    assert sorted(tb3) == list(range(5, STEPS + 1)), sorted(tb3)
    assert_same_as_reference(ref_tb, tb3, REL_TOL, ABS_TOL, "launch 3 (TensorBoard)")
    worst = max(abs(tb3[s][k] - ref_tb[s][k]) / max(abs(ref_tb[s][k]), 1e-30) for s in tb3 for k in COMPARED)
    print(f"kill-resume: steps 5-{STEPS} vs the uninterrupted run: worst relative difference {worst:.3g}")
