"""The Ray runtime env carries the worker-side switches (D2D, memory/profiler, sync path, vLLM/HCCL)."""

from __future__ import annotations

from verl_patches.patching.ray_runtime import forwarded_env, runtime_env


def test_worker_switches_are_forwarded_and_nothing_else() -> None:
    env = {
        "D2D_DATA_TRANSFER": "1",
        "PRINT_MEMORY": "1",
        "PROFILE_UPDATE": "1",
        "NO_ALL_TO_ALL_RESHARD": "1",
        "VLLM_DP_SIZE": "8",
        "HCCL_BUFFSIZE": "300",
        "ASCEND_LAUNCH_BLOCKING": "0",
        "VERL_PATCHES_QUIET": "1",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "HOME": "/root",
        "AWS_SECRET": "x",
        "D2D_DATA_TRANSFERX": "1",
    }
    out = forwarded_env(env)
    assert set(out) == set(env) - {"HOME", "AWS_SECRET", "D2D_DATA_TRANSFERX"}
    assert out["VLLM_DP_SIZE"] == "8"


def test_runtime_env_includes_this_process_switches(monkeypatch) -> None:
    monkeypatch.setenv("D2D_DATA_TRANSFER", "1")
    monkeypatch.setenv("NO_ALL_TO_ALL_RESHARD", "1")
    env = runtime_env({"EXTRA": "y"})["env_vars"]
    assert env["D2D_DATA_TRANSFER"] == "1" and env["NO_ALL_TO_ALL_RESHARD"] == "1" and env["EXTRA"] == "y"
    assert env["TOKENIZERS_PARALLELISM"] == "true"
