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


# The entry with verl's run_ppo replaced by a stub, and a `prepare` that says what it was handed: the CPU proof's
# caller passes one (verl_patches.cpu_proof.main_tiny); the trainer entry never builds the tiny assets itself.
PREPARED_ENTRY = """
import sys
import verl_patches.prelude_patch  # noqa: F401  (the patches, as the entry applies them)
import verl.trainer.main_ppo as upstream
upstream.run_ppo = lambda cfg: print("RUN_PPO", cfg.overlay.profile)
from verl_patches.trainer import main_ppo_npu

def prepare(cfg):
    print("PREPARE", cfg.overlay.profile, cfg.overlay.tiny_assets_dir)
    if sys.argv[1] == "refuse":
        raise ValueError("tiny profile: the assets folder is wrong")

sys.exit(main_ppo_npu.main(sys.argv[3:], prepare=None if sys.argv[2] == "none" else prepare))
"""


def run_prepared(tmp_path: Path, how: str, hook: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERL_PATCHES_RUN_DIR", "TENSORBOARD_DIR")}
    env["PYTHONPATH"] = str(REPO)
    args = [how, hook, "--config-name", "ppo_tiny_local", f"overlay.tiny_assets_dir={tmp_path / 'assets'}"]
    return subprocess.run(
        [sys.executable, "-c", PREPARED_ENTRY, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_tiny_profile_runs_only_with_the_cpu_proofs_prepare(tmp_path: Path) -> None:
    p = run_prepared(tmp_path, "ok", "none")
    assert p.returncode == 2 and "RUN_PPO" not in p.stdout and "PREPARE" not in p.stdout, (p.stdout, p.stderr)
    (line,) = entry_lines(p.stderr)
    assert "python -m verl_patches.cpu_proof.main_tiny" in line and "--tiny" in line
    assert not (tmp_path / "assets").exists()

    p = run_prepared(tmp_path, "ok", "prepare")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines.index(f"PREPARE tiny {tmp_path / 'assets'}") < lines.index("RUN_PPO tiny")  # resolved, then run

    p = run_prepared(tmp_path, "refuse", "prepare")
    assert p.returncode == 2 and "RUN_PPO" not in p.stdout and "Traceback" not in p.stderr
    assert entry_lines(p.stderr) == ["main_ppo_npu: tiny profile: the assets folder is wrong"]
