"""`python3 -m verl_patches.sources.pins check` where torch is missing, the case it exists to report: one line
naming every missing package, exit 1, never a traceback. The environment is this interpreter with its
site-packages switched off (`python -S`): importlib.metadata then finds no distribution and `import torch` fails,
as on a fresh node before `pip install -r requirements.txt`."""

from __future__ import annotations

import os
import subprocess

import pytest

from fresh_python import fresh_python
from verl_patches.base.host_device import DEVICE_ENV, STALE_DEVICE_ENV
from verl_patches.sources import pins


def run_check(*env_pairs: tuple[str, str]) -> subprocess.CompletedProcess:
    # no PYTHONPATH (it could lead back to site-packages), no device override unless the test sets one
    drop = {"PYTHONPATH", DEVICE_ENV, STALE_DEVICE_ENV}
    env = {**{k: v for k, v in os.environ.items() if k not in drop}, **dict(env_pairs)}
    return fresh_python("-S", "-m", "verl_patches.sources.pins", "check", env=env, timeout=120)


def test_check_without_any_package_reports_each_in_one_line_and_exits_1() -> None:
    p = run_check()
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 1
    (line,) = p.stdout.splitlines()
    wanted = pins.read_pins()
    assert line.startswith(f"package versions DIFFER from requirements.txt ({len(wanted) - 1} of {len(wanted)}): ")
    for name, pin in wanted.items():
        if name not in pins.NOT_ON_CPU:  # a CPU host expects torch-npu absent (device files decide: no /dev/davinci*)
            assert f"{name} not installed (pinned {pin.version})" in line, name
    # stderr: at most the receipt lines of the hash-checked install check, each one line prefixed
    assert all(ln.startswith("pins: ") for ln in p.stderr.splitlines())


def test_check_without_torch_on_an_npu_host_also_wants_torch_npu() -> None:
    p = run_check((DEVICE_ENV, "npu"))
    (line,) = p.stdout.splitlines()
    assert p.returncode == 1 and "torch-npu not installed (pinned 2.5.1.post1)" in line
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("value", ["gpu", "VERL"])
def test_a_bad_device_override_is_one_line_exit_2(value: str) -> None:
    p = run_check((DEVICE_ENV, value))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    (line,) = p.stderr.splitlines()
    assert line.startswith("pins: ") and DEVICE_ENV in line


def test_host_is_cpu_falls_back_to_the_device_files_when_torch_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_torch() -> str:
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(pins, "device_kind", no_torch)
    monkeypatch.setattr(pins, "detect_host_device", lambda: "npu")
    assert pins.host_is_cpu() is False
    monkeypatch.setattr(pins, "detect_host_device", lambda: "cpu")
    assert pins.host_is_cpu() is True
