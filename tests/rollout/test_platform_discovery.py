"""vllm-ascend on CPU: discovered through its real entry point (generated .dist-info) on top of the
torch_npu CPU emulation, and its Python-level logic run for real: NPUPlatform's config update, the
worker's distributed set-up over an `hccl` backend (gloo underneath), vLLM's parallel state, and the
model runner up to the first NPU tensor allocation, where the CPU stand-in takes over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.sources import dist_info

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def probe(tiny_model_dir, tmp_path_factory) -> dict:
    dist_path = dist_info.path_entry(REPO)
    if not Path(dist_path, "vllm_ascend-0.9.1.dist-info").is_dir():  # a checkout set up before this existed
        from verl_patches.sources.lock import load_lock

        dist_info.generate(REPO, load_lock(REPO / "sources.lock"), ["vllm", "vllm_ascend"])
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), dist_path])
    p = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("platform_probe.py")), str(tiny_model_dir)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_platform_comes_from_the_real_entry_point(probe) -> None:
    assert probe["entry_points"] == ["ascend=vllm_ascend:register"]
    assert probe["qualname"] == probe["platform"] == "vllm_ascend.platform.NPUPlatform"
    assert (probe["device_type"], probe["dispatch_key"]) == ("npu", "PrivateUse1")


@pytest.mark.slow
def test_npu_platform_updates_the_engine_config(probe) -> None:
    assert probe["worker_cls"] == "vllm_ascend.worker.worker_v1.NPUWorker"  # set by check_and_update_config
    assert probe["block_size"] == 128  # vllm-ascend's default block size


@pytest.mark.slow
def test_worker_sets_up_distributed_and_parallel_state_then_stops_at_the_first_npu_tensor(probe) -> None:
    assert probe["backend"] == "hccl" and probe["worker_device"] == "npu:0"
    assert (probe["tp_world"], probe["dp_world"], probe["ep_world"]) == (1, 1, 1)
    stop = probe["stopped_at"]
    assert stop["file"] == "vllm_ascend/attention/mla_v1.py" and stop["error"] == "NotImplementedError"
    assert "'npu' backend" in stop["message"]
