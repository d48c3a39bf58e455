"""verl_patches.base.host_device: one override variable for every detection of ours; the former name refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.base import host_device
from verl_patches.base.host_device import (
    DEVICE_ENV,
    STALE_DEVICE_ENV,
    DeviceSettingError,
    detect_host_device,
    forced_device,
)

REPO = Path(__file__).resolve().parents[2]


def test_the_override_names_the_device() -> None:
    assert forced_device({}) is None and forced_device({DEVICE_ENV: ""}) is None
    for kind in ("npu", "cuda", "cpu"):
        assert forced_device({DEVICE_ENV: kind}) == kind
        assert detect_host_device({DEVICE_ENV: kind}) == kind
    with pytest.raises(DeviceSettingError, match=r"^VERL_PATCHES_DEVICE='gpu': expected npu, cuda or cpu$"):
        forced_device({DEVICE_ENV: "gpu"})


def test_the_former_name_is_refused_with_the_name_to_use() -> None:
    for env in ({STALE_DEVICE_ENV: "cpu"}, {STALE_DEVICE_ENV: "npu", DEVICE_ENV: "npu"}):
        with pytest.raises(DeviceSettingError) as e:
            detect_host_device(env)
        assert STALE_DEVICE_ENV in str(e.value) and f"set {DEVICE_ENV}=" in str(e.value)
    assert forced_device({STALE_DEVICE_ENV: "", DEVICE_ENV: "cpu"}) == "cpu"  # set but empty: nothing to refuse


def test_detection_without_override_looks_at_the_device_files(tmp_path: Path, monkeypatch) -> None:
    npu, cuda = tmp_path / "davinci0", tmp_path / "nvidia0"
    monkeypatch.setattr(host_device, "_NPU_FILES", (str(npu),))
    monkeypatch.setattr(host_device, "_CUDA_FILES", (str(cuda),))
    assert detect_host_device({}) == "cpu"
    cuda.touch()
    assert detect_host_device({}) == "cuda"
    npu.touch()
    assert detect_host_device({}) == "npu"
    assert detect_host_device({DEVICE_ENV: "cpu"}) == "cpu"  # the override wins


@pytest.mark.parametrize(
    "code",
    [
        "from verl_patches.sources.__main__ import main; raise SystemExit(main(['--verify']))",
        "from verl_patches import device; device.device_kind()",
        "from verl_patches.npu_emulation import install_on_cpu_host; install_on_cpu_host()",
    ],
)
def test_every_detection_of_ours_refuses_the_former_name(code: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != DEVICE_ENV}
    env.update(PYTHONPATH=str(REPO), **{STALE_DEVICE_ENV: "cpu"})
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode != 0 and f"{STALE_DEVICE_ENV}='cpu'" in r.stderr and DEVICE_ENV in r.stderr, r.stderr
