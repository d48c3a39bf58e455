"""The Ray runtime environment (vendor item A1 and §0's fragility): every Ray worker runs our prelude
through worker_process_setup_hook and imports from the repo root first; a local run never joins a
cluster that happens to run on the machine; a cluster run joins exactly RAY_ADDRESS."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_patches.patching.ray_runtime import (
    REPO_ROOT,
    SETUP_HOOK,
    UPSTREAM_ENV_VARS,
    ray_init_kwargs,
    runtime_env,
    worker_pythonpath,
)

ROOT = Path(__file__).resolve().parents[2]


def cfg(num_cpus: int | None = 4, n_gpus: int = 2, nnodes: int = 1):
    return OmegaConf.create(
        {"ray_init": {"num_cpus": num_cpus}, "trainer": {"n_gpus_per_node": n_gpus, "nnodes": nnodes}}
    )


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k in [k for k in os.environ if k.startswith("VERL_PATCHES_")]:
        monkeypatch.delenv(k)


def test_setup_hook_names_an_existing_function_of_the_prelude() -> None:
    module, _, func = SETUP_HOOK.rpartition(".")
    assert module == "verl_patches.prelude_patch"
    path = ROOT / (module.replace(".", "/") + ".py")
    funcs = {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}
    assert func in funcs


def test_runtime_env_has_the_hook_and_repo_root_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(["/opt/other", str(REPO_ROOT), "/opt/more"]))
    env = runtime_env()
    assert env["worker_process_setup_hook"] == SETUP_HOOK
    parts = env["env_vars"]["PYTHONPATH"].split(os.pathsep)
    dist = str(ROOT / ".overlay_dist")  # generated vllm/vllm_ascend metadata (verl_patches.sources.dist_info)
    assert parts == [str(ROOT), dist, "/opt/other", "/opt/more"]  # repo root first, once
    assert REPO_ROOT == ROOT
    for k, v in UPSTREAM_ENV_VARS.items():  # verl's own runtime env is kept
        assert env["env_vars"][k] == v


def test_pythonpath_without_existing_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert worker_pythonpath() == os.pathsep.join([str(ROOT), str(ROOT / ".overlay_dist")])


def test_runtime_env_forwards_our_switches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VERL_PATCHES_DEVICE", "cpu")
    monkeypatch.setenv("VERL_PATCHES_DIES_PER_CARD", "2")
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "x")
    env = runtime_env({"EXTRA": "1"})["env_vars"]
    assert env["VERL_PATCHES_DEVICE"] == "cpu" and env["VERL_PATCHES_DIES_PER_CARD"] == "2"
    assert env["EXTRA"] == "1"
    assert "SOME_OTHER_VARIABLE" not in env


def test_local_cpu_run_starts_its_own_ray_with_logical_gpus() -> None:
    kw = ray_init_kwargs(cfg(num_cpus=4, n_gpus=2, nnodes=3), "cpu")
    assert kw["address"] == "local"  # never a cluster that happens to run here
    assert kw["num_gpus"] == 6 and kw["num_cpus"] == 4
    assert kw["include_dashboard"] is False
    assert kw["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
    assert set(kw) == {"address", "runtime_env", "include_dashboard", "num_cpus", "num_gpus"}


def test_local_accelerator_run_declares_no_logical_gpus() -> None:
    kw = ray_init_kwargs(cfg(num_cpus=None), "npu")
    assert kw["address"] == "local" and "num_gpus" not in kw and "num_cpus" not in kw


def test_cluster_run_joins_ray_address_with_only_the_runtime_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:29444")
    for device in ("cpu", "npu"):
        kw = ray_init_kwargs(cfg(), device)
        assert set(kw) == {"address", "runtime_env"}
        assert kw["address"] == "10.0.0.1:29444"
        assert kw["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
