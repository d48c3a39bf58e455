"""The golden baseline is robust to chaos, not to bugs: the stored bands (recorded from three seeded runs,
`python -m verl_patches.trainer.golden_record`) pass README command 1 (test_tiny_grpo.py checks the full
60-step run) and fail the same command with a real fault: the learning rate forced to 0, so the policy never
moves and the reward stays where the base model starts (tiny_base.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tiny_job import REPO, TinyRun, env_for_run, run_tiny
from verl_patches.trainer.golden import VAL_KEY

BASELINE = REPO / "verl_patches" / "trainer" / "config" / "ppo_tiny_local.baseline.json"
# five reward windows: the tiny run starts from a base model (tiny_base.py) that already answers about half the
# problems, so a stalled policy stays at the base's rate (about 0.48 a window), inside the first three windows'
# bands (floors 0.48, 0.56, 0.56 minus 0.1); the healthy run has moved clearly past it by the fifth (41-50:
# 0.69 minus 0.1), with the CPU kernels pinned to AVX2 (trainer/cpu_numerics.py)
FAULT_STEPS = 50


def _golden(run_dir: Path, *extra: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_patches.trainer.golden",
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
    )  # validating as the healthy run does, at steps 0 and 20
    assert fault.returncode == 0, fault.output[-4000:]
    assert sorted(fault.steps) == list(range(1, FAULT_STEPS + 1))
    rc, report = _golden(fault.run_dir, "--up-to-step", str(FAULT_STEPS))
    failed = [c for c in report["checks"] if c["status"] == "regression"]
    assert rc == 1 and failed, report
    # what fails is the reward, window by window (and validation where the healthy runs had already risen by
    # step 20), not memory or the log-prob agreement: the fault is the update
    reward = [c for c in failed if c["metric"] == "critic/score/mean"]
    assert reward and {c["metric"] for c in failed} <= {"critic/score/mean", VAL_KEY}, failed
    assert reward[-1]["where"].endswith(f"-{FAULT_STEPS}"), failed
