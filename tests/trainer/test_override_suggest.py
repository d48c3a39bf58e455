"""A misspelt Hydra override names the nearest existing key (difflib), in the trainer entry, the launcher's dry
run and the launch, instead of Hydra's advice to add the misspelt key with '+' (which runs without it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from verl_patches.trainer.config_compose import ConfigCompositionError, compose_config
from verl_patches.trainer.override_suggest import nearest_key, unknown_key_message, unknown_override_key

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "trainer": {"save_freq": -1, "test_freq": 5, "val_before_train": True, "nnodes": 16},
    "actor_rollout_ref": {
        "actor": {"optim": {"lr": 1e-6, "lr_warmup_steps": 0}},
        "rollout": {"n": 16, "temperature": 0.9},
    },
}


@pytest.mark.parametrize(
    "key, near",
    [
        ("trainer.save_freqq", "trainer.save_freq"),  # a typo in the last segment
        ("trainr.save_freq", "trainer.save_freq"),  # in the first
        ("actor_rollout_ref.actr.optim.lr", "actor_rollout_ref.actor.optim.lr"),  # in the middle
        ("actor_rollout_ref.rollout.save_freq", "trainer.save_freq"),  # under the wrong parent
        ("trainer.save_freq.every", "trainer.save_freq"),  # past a value
        ("trainer.zzzqqq", None),  # nothing like it
    ],
)
def test_nearest_key(key, near):
    assert nearest_key(CONFIG, key) == near


def test_hydra_messages_give_the_key():
    assert unknown_override_key("Could not override 'a.b'.\nTo append to your config use +a.b=1") == "a.b"
    assert unknown_override_key("Could not delete from config. 'a.c' does not exist.") == "a.c"
    assert unknown_override_key("Could not find 'profile/x'") is None


def test_without_a_near_key_the_message_says_how_to_add_one():
    msg = unknown_key_message("cfg", "trainer.zzz", "trainer.zzz=1", None)
    assert "none like it under 'trainer'" in msg and "'+trainer.zzz=1'" in msg
    assert "nothing to delete" in unknown_key_message("cfg", "trainer.zzz", "~trainer.zzz", None)


def test_compose_names_the_nearest_key_of_the_profile_config():
    with pytest.raises(ConfigCompositionError) as e:
        compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", "trainer.save_freqq=5"])
    msg = str(e.value)
    assert "no key 'trainer.save_freqq' (from the override 'trainer.save_freqq=5')" in msg
    assert "the nearest key is 'trainer.save_freq'" in msg and "+trainer" not in msg
    # a key of our own config, under verl's
    with pytest.raises(ConfigCompositionError, match="the nearest key is 'overlay.d2d_tensor_cache'"):
        compose_config("ppo_mindspeed_trainer", ["overlay.d2d_tensor_cach=False"])


def test_the_dry_run_and_the_trainer_entry_name_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH")}
    dry = subprocess.run(
        [
            "bash",
            "verl_patches/scripts/train_deepseekv3_256die_random_init.sh",
            "--dry-run",
            "--",
            "trainr.save_freq=5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry.returncode == 2, dry.stdout + dry.stderr
    assert "the nearest key is 'trainer.save_freq'" in dry.stderr
    entry = subprocess.run(
        [str(ROOT / ".venv/bin/python"), "-m", "verl_patches.trainer.main_ppo_npu", "trainer.test_freqq=1"],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert entry.returncode == 2, entry.stdout + entry.stderr
    assert "the nearest key is 'trainer.test_freq'" in entry.stderr
