"""The golden baseline is robust to chaos, not to bugs: the stored bands (recorded from three runs,
`python -m verl_patches.cpu_proof.golden_record`) pass README command 1 (test_tiny_grpo.py checks the full
60-step run) and fail the same command with a real fault: the learning rate forced to 0, so the policy never
moves from the reference.

The fault run is 10 steps: what catches it is the policy drift (the actor's KL to the reference, window by
window), 0 from the first step, while every recorded run has moved by its first window. The reward would
catch it only from step 41 (the tiny run starts from a base model, tiny_base.py, that already answers about
half the problems, so a stalled policy stays inside the first windows' reward bands); the reward and
validation windows are unit-tested in tests/cpu_proof/test_golden.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_job import REPO, TinyRun, env_for_run, run_tiny
from verl_patches.cpu_proof.golden import DRIFT_KEY, REWARD_KEY, VAL_KEY

BASELINE = REPO / "verl_patches" / "trainer" / "config" / "ppo_tiny_local.baseline.json"
FAULT_STEPS = 10  # the first window of the baseline (tolerances.reward_window)


def _golden(run_dir: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_patches.cpu_proof.golden",
            str(run_dir),
            "--check-against",
            str(BASELINE),
            "--json",
            *extra,
        ],
        cwd=REPO,
        env=env_for_run(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_a_zero_learning_rate_fails_the_golden_check_that_the_healthy_run_passes(
    tmp_path: Path, tiny_a3_assets: Path, a3_run: TinyRun
) -> None:
    assert a3_run.returncode == 0, a3_run.output[-4000:]
    rc, report = _golden(a3_run.run_dir, "--up-to-step", str(FAULT_STEPS))
    assert rc == 0, report  # the healthy run, over the same windows

    fault = run_tiny(
        tmp_path / "logs",
        tiny_a3_assets,
        ("actor_rollout_ref.actor.optim.lr=0", f"trainer.total_training_steps={FAULT_STEPS}"),
        timeout=1500,
    )  # validating as the healthy run does, before step 1 (and at its last step)
    assert fault.returncode == 0, fault.output[-4000:]
    assert sorted(fault.steps) == list(range(1, FAULT_STEPS + 1))
    assert all(fault.steps[s]["actor/kl_loss"] == 0 for s in fault.steps), fault.steps  # never left the reference
    rc, report = _golden(fault.run_dir, "--up-to-step", str(FAULT_STEPS))
    failed = [c for c in report["checks"] if c["status"] == "regression"]
    assert rc == 1 and failed, report
    # what fails is the policy drift, not memory or the log-prob agreement: the fault is the update
    drift = [(c["metric"], c["where"]) for c in failed if c["metric"] == DRIFT_KEY]
    assert drift == [(DRIFT_KEY, "steps 1-10")], failed
    assert {c["metric"] for c in failed} <= {DRIFT_KEY, REWARD_KEY, VAL_KEY}, failed
