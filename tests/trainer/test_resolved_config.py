"""The run folder gets the config the run ran with (`resolved_config`): written by the trainer entry before any
worker starts, resolved, as YAML, whole, private; the entry refuses to start when it cannot write it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl_patches.trainer.config_compose import compose_config, resolved
from verl_patches.trainer.resolved_config import FILE_NAME, config_text, save_resolved_config

REPO = Path(__file__).resolve().parents[2]
OVERRIDES = ["profile=a3_256die_random_init", "trainer.total_epochs=3", "trainer.default_local_dir=/shared/ckpt/x"]


@pytest.fixture(scope="module")
def cfg() -> object:
    return resolved(compose_config("ppo_mindspeed_trainer", OVERRIDES))


def test_the_text_is_the_resolved_config_under_a_header_naming_the_command(cfg: object) -> None:
    text = config_text(cfg, "ppo_mindspeed_trainer", OVERRIDES)
    assert "${" not in text
    assert yaml.safe_load(text) == OmegaConf.to_container(cfg)
    header = text.splitlines()[:2]
    assert all(line.startswith("# ") for line in header)
    assert '"trainer.total_epochs=3"' in header[1] and '"ppo_mindspeed_trainer"' in header[1]


def test_an_override_cannot_write_outside_the_comment(cfg: object) -> None:
    text = config_text(cfg, "ppo_mindspeed_trainer", ["data.x=a\ninjected: 1"])
    assert "injected" not in yaml.safe_load(text)


def test_saved_whole_and_private_into_the_run_folder(cfg: object, tmp_path: Path) -> None:
    assert save_resolved_config(cfg, "ppo_mindspeed_trainer", OVERRIDES, None) is None
    target = save_resolved_config(cfg, "ppo_mindspeed_trainer", OVERRIDES, tmp_path)
    assert target == tmp_path / FILE_NAME
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert yaml.safe_load(target.read_text())["trainer"]["total_epochs"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE_NAME]  # no temp left behind
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(OSError):
        save_resolved_config(cfg, "ppo_mindspeed_trainer", OVERRIDES, tmp_path / "a-file")


# The entry as the launcher starts it, with verl's run_ppo replaced by a stub that reports what it was handed.
ENTRY = """
import sys
import verl_patches.prelude_patch  # noqa: F401  (the patches, as the entry applies them)
import verl.trainer.main_ppo as upstream
upstream.run_ppo = lambda cfg: print("RUN_PPO", cfg.trainer.total_epochs)
from verl_patches.trainer import main_ppo_npu
sys.exit(main_ppo_npu.main(sys.argv[1:]))
"""


def run_entry(tmp_path: Path, tensorboard_dir: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "VERL_PATCHES_RUN_DIR")}
    env.update(PYTHONPATH=str(REPO), TENSORBOARD_DIR=str(tensorboard_dir))
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *OVERRIDES], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_the_entry_saves_it_before_running_and_stops_when_it_cannot(cfg: object, tmp_path: Path) -> None:
    run = tmp_path / "a3-20260101-000000-head-node1"
    run.mkdir(mode=0o700)
    p = run_entry(tmp_path, run / "tensorboard")
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert lines.index(f"main_ppo_npu: resolved config: {run / FILE_NAME}") < lines.index("RUN_PPO 3")
    assert yaml.safe_load((run / FILE_NAME).read_text()) == OmegaConf.to_container(cfg)

    (tmp_path / "not-a-folder").write_text("x")
    p = run_entry(tmp_path, tmp_path / "not-a-folder" / "tensorboard")
    assert p.returncode == 2 and "RUN_PPO" not in p.stdout
    assert [ln for ln in p.stderr.splitlines() if ln.startswith("main_ppo_npu: cannot save the resolved config")]
