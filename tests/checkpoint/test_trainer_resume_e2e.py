"""verl's real GRPO trainer (Ray, the tiny run with verl's FSDP actor and HF rollout) through our checkpoint
patches of ``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``: one step saved, then the same command
with one more step resumes from the last checkpoint, says so in one line and runs only
the new step. (The Megatron tiny run of the A3 path is not used here: see the module docstring of
test_kill_resume.py for the kill-and-resume test on the Megatron engine.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STEP_LINE = re.compile(r"step:(\d+) - ")
FSDP_PROFILE = (
    "ppo_tiny_local_fsdp"
    if (REPO / "verl_patches/trainer/config/ppo_tiny_local_fsdp.yaml").exists()
    else "ppo_tiny_local"
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]


def run(assets: Path, ckpt: Path, steps: int) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "verl_patches.trainer.main_ppo_npu",
            "--config-name",
            FSDP_PROFILE,
            f"overlay.tiny_assets_dir={assets}",
            f"trainer.total_training_steps={steps}",
            "trainer.logger=[console]",
            "trainer.save_freq=1",
            "trainer.max_actor_ckpt_to_keep=1",
            f"trainer.default_local_dir={ckpt}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=False",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=700,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


def test_trainer_saves_each_step_and_resumes_with_one_line(tmp_path: Path) -> None:
    from verl_patches.trainer.tiny_assets import TinySpec, prepare

    assets = tmp_path / "assets"
    prepare(assets, TinySpec(seed=1, max_operand=2), progress=False)
    ckpt = tmp_path / "ckpt"

    first = run(assets, ckpt, 1)
    assert "verl_patches resume: starting from step 0 (no complete checkpoint under" in first
    assert re.search(r"verl_patches checkpoint: step 1 saved to .*global_step_1", first), first[-3000:]
    assert sorted(int(m) for m in STEP_LINE.findall(first)) == [1]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text() == "1"

    second = run(assets, ckpt, 2)
    lines = [ln for ln in second.splitlines() if "verl_patches resume:" in ln]
    assert len(lines) == 1 and f"from {ckpt / 'global_step_1'} (step 1;" in lines[0], lines
    assert "dataloader restored" in lines[0]
    assert sorted(int(m) for m in STEP_LINE.findall(second)) == [2], second[-3000:]
    assert re.search(r"verl_patches checkpoint: step 2 saved to .*pruned \['global_step_1'\]", second)
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == ["global_step_2"]
