"""vllm-ascend on CPU: discovered through its real entry point (generated .dist-info) on top of the
torch_npu CPU emulation, and its Python-level logic run for real: NPUPlatform's config update, the
worker's distributed set-up over an `hccl` backend (gloo underneath), vLLM's parallel state, and its model
runner with its buffers on the emulated npu device (the whole engine, built and decoding, is
tests/rollout/test_a3_engine_build.py)."""

from __future__ import annotations

import pytest

from probe_runner import run_probe


@pytest.fixture(scope="module")
def probe(tiny_model_dir) -> dict:
    return run_probe("platform_probe.py", tiny_model_dir)


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
