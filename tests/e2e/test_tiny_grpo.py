"""End to end on this CPU machine: verl v0.4.0's real GRPO trainer through our entry and patches only.

These are the slow tests: each starts a local Ray cluster, an FSDP actor/ref worker and the HF
rollout, and trains the tiny DeepSeek-V3-shaped model on generated additions with our reward.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"step:(\d+) - (.*)")


def parse_steps(output: str) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for m in STEP_LINE.finditer(output):
        metrics = {}
        for item in m.group(2).split(" - "):
            key, _, value = item.strip().partition(":")
            try:
                metrics[key] = float(value)
            except ValueError:
                continue
        steps[int(m.group(1))] = metrics
    return steps


def env_for_run() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def tiny_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from verl_patches.trainer.tiny_assets import TinySpec, prepare

    root = tmp_path_factory.mktemp("tiny_assets")
    prepare(root, TinySpec(seed=1, max_operand=2), progress=False)
    return root


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", ["fsdp", "fsdp2"])
def test_two_grpo_steps_of_verls_trainer_run_on_cpu_through_our_patches(tiny_assets: Path, strategy: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "verl_patches.trainer.main_ppo_npu", "--config-name", "ppo_tiny_local",
         f"overlay.tiny_assets_dir={tiny_assets}", "trainer.total_training_steps=2", "trainer.logger=[console]",
         f"actor_rollout_ref.actor.strategy={strategy}", f"actor_rollout_ref.ref.strategy={strategy}",
         f"critic.strategy={strategy}"],
        cwd=REPO, env=env_for_run(), capture_output=True, text=True, timeout=580)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    steps = parse_steps(out)
    assert sorted(steps) == [1, 2], out[-3000:]
    for n, metrics in steps.items():
        for key in ("actor/pg_loss", "actor/kl_loss", "critic/score/mean", "timing_s/gen", "timing_s/update_actor",
                    "perf/system_tokens_per_s_per_die"):
            assert key in metrics and math.isfinite(metrics[key]), (n, key, metrics)
    # The prelude ran in the driver and in the Ray worker processes (their lines carry Ray's prefix).
    assert re.search(r"^verl_patches active in pid \d+ \(device=cpu\)", out, re.M), out[:2000]
    assert len(re.findall(r"\((?:\w+ )?pid=\d+\)\S* verl_patches active in pid", out)) >= 2, out[-3000:]  # task runner + worker
    # Nothing was written into the vendored verl tree: only the prelude line differs from upstream.
    verify = subprocess.run(["bash", "setup_sources.sh", "--verify", "--only", "verl"], cwd=REPO,
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_tiny_profile_of_the_launch_script_raises_the_mean_reward(tiny_assets: Path, tmp_path: Path) -> None:
    """README command 1's run: the same script as the cluster job, --tiny, with a fixed seed."""
    proc = subprocess.run(
        ["bash", "verl_patches/scripts/train_deepseekv3_256die_random_init.sh", "--tiny", "--log-dir", str(tmp_path),
         "--", f"overlay.tiny_assets_dir={tiny_assets}"],
        cwd=REPO, env=env_for_run(), capture_output=True, text=True, timeout=1150)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    steps = parse_steps(out)
    scores = [steps[n]["critic/score/mean"] for n in sorted(steps)]
    assert len(scores) == 60, scores
    first, last = sum(scores[:5]) / 5, sum(scores[-10:]) / 10
    assert last >= first + 0.15 and last >= 0.25, f"reward did not rise: first 5 {first:.3f}, last 10 {last:.3f}: {scores}"
    run_dirs = list(tmp_path.glob("tiny-*-local-*"))
    assert len(run_dirs) == 1 and (run_dirs[0] / "trainer.log").stat().st_size > 0
    assert list((run_dirs[0] / "tensorboard").rglob("events.out.tfevents.*")), "no TensorBoard events written"
