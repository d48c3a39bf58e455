"""vllm-ascend on CPU: discovered through its real entry point (generated .dist-info) on top of the
torch_npu CPU emulation, and its Python-level logic run for real: NPUPlatform's config update, the
worker's distributed set-up over an `hccl` backend (gloo underneath), vLLM's parallel state, and its model
runner with its buffers on the emulated npu device (the whole engine, built and decoding, is
tests/rollout/test_a3_engine_build.py)."""

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
def test_worker_sets_up_distributed_parallel_state_and_its_model_runner_on_the_npu_device(probe) -> None:
    assert probe["backend"] == "hccl" and probe["worker_device"] == "npu:0"
    assert (probe["tp_world"], probe["dp_world"], probe["ep_world"]) == (1, 1, 1)
    assert probe["stopped_at"] is None, probe["stopped_at"]
    assert probe["model_runner"] == "vllm_ascend.worker.model_runner_v1.NPUModelRunner"
    assert probe["runner_buffers_device"] == "npu:0"  # e.g. its input_ids buffer: an npu tensor in host memory
