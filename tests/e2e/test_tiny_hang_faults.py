"""A stuck rank on the tiny A3-path run (README command 1: verl's Megatron actor/ref on MindSpeed, TP2 x EP2,
4 Ray workers, vllm-ascend's engine at rollout EP2, our weight sync, the D2D cache) is named, the job ends
by itself, and the same command resumes.

Three launches of the same command share one checkpoint folder (a checkpoint every step, no validation),
with `VERL_PATCHES_COLLECTIVE_TIMEOUT_S` shortened to `TIMEOUT_S`. In each, one Ray worker stops itself
(SIGSTOP, `VERL_PATCHES_INJECT_STOP=<rank>:<phase>:<step>`, after publishing its position) when it enters:
generation of step 2, the update of step 3, the weight sync of step 4. Each time the launcher's last line
names that rank (with node and pid), its phase and its step, the job exits non-zero within the time-out
plus `EXIT_SLACK_S` of the stop, and no process of the job is left. Each next launch resumes from the last
checkpoint (one line says so) and logs the steps from there to its own fault: the resume after a stop in
generation and after a stop in the update. A fourth launch after the weight-sync stop would resume the same
way (from the checkpoint before the stopped step, whatever the phase) and is left out for the suite's time;
a resumed run that goes on to its last step and ends with status 0 is test_tiny_kill_resume.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import tiny_job
from tiny_job import TinyJob, resume_lines, step_order

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multiproc,
    pytest.mark.timeout(3600),
    pytest.mark.needs_components("mindspeed", "mindspeed_llm"),
]

TIMEOUT_S = 20
STEPS = 4
FAULTS = ((1, "generate", 2), (2, "update", 3), (0, "weight_sync", 4))  # (rank, phase, step) per launch
CALL_OF = {"generate": "generate_sequences", "update": "update_actor", "weight_sync": "generate_sequences"}
TO_FAULT_S = 900  # start-up and the steps before the fault, on a loaded 2-core host
EXIT_SLACK_S = 60  # the driver's look interval, the flight of the last marks, Ray's and the launcher's teardown
STOP_LINE = r"verl_patches fault injection: rank {rank} stops itself \(SIGSTOP, pid (\d+)\)"


def overrides(ckpt: Path) -> tuple[str, ...]:
    return (
        f"trainer.total_training_steps={STEPS}",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=2",
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


def last_line(output: str) -> str:
    return [line for line in output.splitlines() if line.strip()][-1]


def test_a_stopped_worker_is_named_the_job_ends_and_the_same_command_resumes(
    monkeypatch: pytest.MonkeyPatch, tiny_a3_assets: Path, tmp_path: Path
) -> None:
    ckpt = tmp_path / "ckpt"
    outputs, timings = [], []
    t0 = time.monotonic()
    for n, (rank, phase, step) in enumerate(FAULTS, start=1):
        job = launch(monkeypatch, tmp_path / f"launch{n}", tiny_a3_assets, ckpt, f"{rank}:{phase}:{step}")
        try:
            pid = int(job.wait_for(STOP_LINE.format(rank=rank), TO_FAULT_S).group(1))
            stopped = time.monotonic()
            rc = job.wait(TIMEOUT_S + EXIT_SLACK_S)
            ended = time.monotonic()
            left = job.survivors()
            out = job.output
        finally:
            job.close()
        outputs.append(out)
        timings.append((stopped - t0, ended - stopped))
        t0 = ended
        assert rc != 0, out[-4000:]
        assert ended - stopped <= TIMEOUT_S + EXIT_SLACK_S
        assert not left, f"processes of launch {n} left after it ended: {left}"
        line = last_line(out)
        assert "verl_patches hang:" in line, out[-4000:]
        assert f"stuck: rank {rank} (node " in line and f", pid {pid}) stopped reporting " in line, line
        assert f"(process frozen or dead), last in phase '{phase}'" in line, line
        assert f"of step {step} in {CALL_OF[phase]}; its log: " in line, line
        assert line.count("verl_patches hang:") == 1 and f"(VERL_PATCHES_COLLECTIVE_TIMEOUT_S={TIMEOUT_S})" in line
    print(
        "hang faults: "
        + "; ".join(
            f"launch {n}: stopped after {a:.0f} s, ended {b:.0f} s later" for n, (a, b) in enumerate(timings, start=1)
        )
    )

    # the steps each launch logged, and where each one resumed from
    assert step_order(outputs[0]) == [1]
    assert "starting from step 0 (no complete checkpoint under" in resume_lines(outputs[0])[0]
    for n, resumed_from in ((1, 1), (2, 2)):
        lines = resume_lines(outputs[n])
        assert len(lines) == 1 and lines[0].startswith(
            f"verl_patches resume: from {ckpt / f'global_step_{resumed_from}'} (step {resumed_from};"
        ), lines
        assert step_order(outputs[n]) == list(range(resumed_from + 1, FAULTS[n][2])), (
            n,
            step_order(outputs[n]),
        )
