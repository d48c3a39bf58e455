"""The trainer entry as a user runs it (vendor item A1): `--print-config` prints the resolved config and
exits 0 without starting anything; a config error exits 2 with a message naming the key, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
ENTRY = [sys.executable, "-m", "verl_patches.trainer.main_ppo_npu"]


def run_entry(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "RAY_ADDRESS")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([*ENTRY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def entry_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("main_ppo_npu:")]


def test_print_config_prints_the_resolved_profile() -> None:
    p = run_entry("--print-config", "profile=a3_256die_random_init", "trainer.total_epochs=3")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert "${" not in p.stdout  # resolved, interpolations included
    assert cfg["overlay"]["profile"] == "a3-256die-random-init" and cfg["overlay"]["vllm_dp_size"] == 128
    assert cfg["actor_rollout_ref"]["actor"]["megatron"]["pipeline_parallel_num_layer_list"] == [7, 7, 8, 8, 8, 8, 8, 7]
    assert cfg["trainer"]["total_epochs"] == 3  # overrides apply after the profile
    assert cfg["custom_reward_function"]["path"] == str(REPO / "verl_patches" / "reward" / "entry.py")
    assert "Traceback" not in p.stderr


def test_print_config_of_the_tiny_config_builds_nothing(tmp_path: Path) -> None:
    assets = tmp_path / "assets"
    p = run_entry("--config-name", "ppo_tiny_local", "--print-config", f"overlay.tiny_assets_dir={assets}")
    assert p.returncode == 0, p.stderr
    cfg = yaml.safe_load(p.stdout)
    assert cfg["overlay"]["profile"] == "tiny"
    assert cfg["actor_rollout_ref"]["model"]["path"] == str(assets / "model")
    assert not assets.exists()  # printing is not running


@pytest.mark.parametrize(
    "override, key",
    [
        ("actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_epochs"),
        (
            "actor_rollout_ref.actor.megatron.optimizer_offload=True",
            "actor_rollout_ref.actor.megatron.optimizer_offload",
        ),
        ("actor_rollout_ref.actor.ppo_epoch=2", "actor_rollout_ref.actor.ppo_epoch"),  # a typo: Hydra's error
    ],
)
def test_config_errors_exit_2_naming_the_key(override: str, key: str) -> None:
    p = run_entry("profile=a3_256die_true_weight", override)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = entry_lines(p.stderr)
    assert len(lines) == 1, p.stderr  # one message, not one per layer of the stack
    assert key in p.stderr


def test_unknown_option_exits_2() -> None:
    p = run_entry("--no-such-option", "profile=a3_256die_true_weight")
    assert p.returncode == 2 and "--no-such-option" in p.stderr and "Traceback" not in p.stderr


def test_a_shared_checkpoint_root_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """On a cluster profile the entry refuses a root others can write into in one line, exit 2, before Ray or
    any worker starts (the resume would refuse it too, but inside a Ray worker, as a traceback)."""
    tmp_path.chmod(0o700)
    root = tmp_path / "ck"
    root.mkdir()
    root.chmod(0o770)
    p = run_entry("profile=a3_256die_true_weight", f"trainer.default_local_dir={root}")
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    (line,) = entry_lines(p.stderr)
    assert line.startswith(f"main_ppo_npu: {root}: others can change what is saved there")
    assert "VERL_PATCHES_ALLOW_SHARED_CKPT_ROOT=1" in line
    assert "resolved config" not in p.stdout  # nothing written to the run folder, nothing started
