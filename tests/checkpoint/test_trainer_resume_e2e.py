"""README command 1's FSDP + HF option (`train_deepseekv3_256die_random_init.sh --tiny --tiny-engine fsdp`:
verl's FSDP actor with the fused group and the HF rollout) through verl's real GRPO trainer and our
checkpoint patches of ``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``: one step saved, then the same
command with one more step resumes from the last checkpoint, says so in one line and runs only the new step.
Each step logs finite losses, reward, timings and throughput, and nothing was written into the vendored verl
tree. (The Megatron tiny run of the A3 path is tests/e2e's; a rank killed while saving is test_kill_resume.py's.)
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path

import pytest

from tests.e2e.tiny_job import REPO, run_tiny

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

FINITE = (
    "actor/pg_loss",
    "actor/kl_loss",
    "critic/score/mean",
    "timing_s/gen",
    "timing_s/update_actor",
    "perf/system_tokens_per_s_per_die",
)


def run(log_dir: Path, assets: Path, ckpt: Path, steps: int, expected: list[int]) -> str:
    overrides = (
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console]",
        "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=1",
        f"trainer.default_local_dir={ckpt}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=False",
    )
    done = run_tiny(log_dir, assets, overrides, engine="fsdp", timeout=900)
    assert done.returncode == 0, done.output[-4000:]
    assert "verl.workers.fsdp_workers.ActorRolloutRefWorker" in done.output, done.output[-3000:]
    assert sorted(done.steps) == expected, done.output[-3000:]
    for n, metrics in done.steps.items():
        for key in FINITE:
            assert key in metrics and math.isfinite(metrics[key]), (n, key, metrics)
    return done.output


def test_the_fsdp_option_saves_each_step_and_resumes_with_one_line(tmp_path: Path) -> None:
    assets, ckpt = tmp_path / "assets", tmp_path / "ckpt"

    first = run(tmp_path / "logs1", assets, ckpt, 1, [1])
    assert "verl_patches resume: starting from step 0 (no complete checkpoint under" in first
    assert re.search(r"verl_patches checkpoint: step 1 saved to .*global_step_1", first), first[-3000:]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "1"

    second = run(tmp_path / "logs2", assets, ckpt, 2, [2])
    lines = [ln for ln in second.splitlines() if "verl_patches resume:" in ln]
    assert len(lines) == 1 and f"from {ckpt / 'global_step_1'} (step 1;" in lines[0], lines
    assert "dataloader restored" in lines[0]
    assert re.search(r"verl_patches checkpoint: step 2 saved to .*pruned \['global_step_1'\]", second)
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["global_step_2"]

    # nothing was written into the vendored verl tree: only the prelude line differs from upstream
    verify = subprocess.run(
        ["bash", "setup_sources.sh", "--verify", "--only", "verl"], cwd=REPO, capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
