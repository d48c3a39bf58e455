"""``trainer.logger``: a backend verl does not know, or one whose package is not installed, is refused by the dry
run (the preflight) and at the job's start, by one check (`config_checks.check_config`), in one line naming the
key, the backend and how to install it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from omegaconf import OmegaConf

from verl_patches.driver import logger_backends
from verl_patches.driver.config_checks import OverlayConfigError, check_config, raise_on_problems
from verl_patches.driver.logger_backends import BACKENDS, KEY, installed, logger_backend_problems
from verl_patches.launch.preflight.findings import FAIL, HostFacts
from verl_patches.launch.preflight.report import compose, run_preflight
from verl_patches.launch.preflight.report import main as preflight_main
from verl_patches.launch.settings import load_settings
from verl_patches.patching.ray_runtime import forwarded_env

REPO = Path(__file__).resolve().parents[2]
CPU = HostFacts(device="cpu")


def cfg(logger: Any) -> Any:
    return OmegaConf.create({"trainer": {"logger": logger}})


def spec_finder(present: set[str]):
    """A find_spec that knows only `present` (as real packages)."""
    return lambda name: SimpleNamespace(origin=f"/site/{name}/__init__.py") if name in present else None


def test_the_names_are_the_pinned_verls() -> None:
    from verl.utils.tracking import Tracking

    assert set(BACKENDS) == set(Tracking.supported_backend) | {"tracking"}


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_each_backend_is_refused_without_its_package_and_accepted_with_it(name: str) -> None:
    module, how = BACKENDS[name]
    missing = logger_backend_problems(cfg(["console", name]), spec_finder(set()))
    if module is None:
        assert missing == []
        return
    assert missing == [
        f"{KEY}: backend {name!r} needs the Python package {module!r}, which is not installed for "
        f"{sys.executable}: {how} on every node, or remove {name!r} from {KEY}"
    ]
    assert logger_backend_problems(cfg([name]), spec_finder({module})) == []
    assert logger_backend_problems(cfg(name), spec_finder(set())) == missing  # one name, not a list


def test_unknown_names_are_refused_with_the_nearest_known_one() -> None:
    problems = logger_backend_problems(cfg(["console", "wandbb", 3, "tensorboard"]), spec_finder({"tensorboard"}))
    assert len(problems) == 2
    assert problems[0].startswith(f"{KEY}: 'wandbb' is not a logger verl v0.4.0 knows (did you mean 'wandb'?)")
    assert problems[1].startswith(f"{KEY}: 3 is not a logger verl v0.4.0 knows; use any of console, tensorboard")
    assert logger_backend_problems(cfg([]), spec_finder(set())) == []  # verl then logs nowhere: allowed
    assert logger_backend_problems(OmegaConf.create({"trainer": {}}), spec_finder(set())) == []  # verl's default


def test_installed_asks_for_a_real_package_not_a_folder_of_that_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "verl_patches_no_such_logger_pkg"
    (tmp_path / name).mkdir()  # as wandb's own ./wandb/ run folder in the working directory
    monkeypatch.syspath_prepend(str(tmp_path))
    assert not installed(name)  # a namespace package only
    (tmp_path / name / "__init__.py").write_text("")
    assert installed(name)
    assert installed("json") and not installed("verl_patches_absent_module_xyz")
    assert not installed("bad..name")  # find_spec's ValueError is a no


def test_the_job_start_and_the_preflight_refuse_a_missing_backend_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logger_backends, "installed", lambda module, find_spec=None: module != "wandb")
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings({}, None, environ={})
    composed = compose(
        "ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", "trainer.logger=[console,wandb]"], settings, REPO
    )
    line = next(p for p in check_config(composed) if p.startswith(KEY))
    assert "'wandb'" in line and "pip install wandb" in line
    with pytest.raises(OverlayConfigError, match="pip install wandb"):  # the job's start (entry and fit loop)
        raise_on_problems(composed)
    found = [f for f in run_preflight(composed, settings, REPO, CPU) if f.status == FAIL]
    assert [(f.check, f.message, f.key) for f in found] == [("config.semantic", line, KEY)]


def test_the_dry_run_command_fails_naming_the_key(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(logger_backends, "installed", lambda module, find_spec=None: module != "swanlab")
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")
    argv = ["--profile", "a3_256die_true_weight", "--json", "trainer.logger=[console,tensorboard,swanlab]"]
    assert preflight_main(argv, host=CPU) == 1
    report = json.loads(capsys.readouterr().out)
    failures = [f for f in report["findings"] if f["status"] == FAIL]
    assert [f["key"] for f in failures] == [KEY] and "pip install swanlab" in failures[0]["message"]


@pytest.mark.skipif(installed("wandb"), reason="wandb is installed here: nothing to refuse")
def test_the_trainer_entry_exits_2_before_anything_starts() -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO)
    p = subprocess.run(
        [sys.executable, "-m", "verl_patches.trainer.main_ppo_npu", "profile=a3_256die_true_weight"]
        + ["trainer.logger=[console,wandb]", "trainer.default_local_dir=/shared/ckpt/x"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 2
    assert f"{KEY}: backend 'wandb' needs the Python package 'wandb'" in p.stderr and "Traceback" not in p.stderr


def test_the_backends_settings_reach_the_driver_process() -> None:
    env = {"WANDB_API_KEY": "k", "WANDB_MODE": "offline", "SWANLAB_API_KEY": "s", "MLFLOW_TRACKING_URI": "u"}
    assert forwarded_env({**env, "HOME": "/root"}) == env
