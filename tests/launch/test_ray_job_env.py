"""The trainer's runtime env under `ray job submit` (issue 42, item 5): Ray merges the job's runtime env with the
driver's and refuses any field or variable both set, so ours gives way to the job's on every variable, keeps the
setup hook that runs our prelude in every worker, and refuses (one line) a job env that would keep it out."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.patching.ray_runtime import (
    RAY_JOB_CONFIG_ENV,
    REPO_ROOT,
    SETUP_HOOK,
    RuntimeEnvConflict,
    for_ray_job,
    ray_init_kwargs,
    ray_job_runtime_env,
    runtime_env,
)

OURS = {
    "env_vars": {"PYTHONPATH": str(REPO_ROOT), "VLLM_USE_V1": "1", "NCCL_DEBUG": "WARN"},
    "worker_process_setup_hook": SETUP_HOOK,
}


def ray_merge(parent: dict, child: dict) -> dict | None:
    """Ray 2.46's own merge (what ray.init does with the job's and the driver's runtime env)."""
    from ray.runtime_env.runtime_env import _merge_runtime_env

    return _merge_runtime_env(parent, child, override=False)


names = st.sampled_from(["PYTHONPATH", "VLLM_USE_V1", "NCCL_DEBUG", "HCCL_BUFFSIZE", "OTHER"])


@settings(deadline=None)
@given(
    st.dictionaries(names, st.sampled_from(["1", "x", str(REPO_ROOT), f"{REPO_ROOT}{os.pathsep}/opt"])),
    st.booleans(),
    st.booleans(),
)
def test_the_job_and_ours_always_merge_and_the_hook_survives(job_vars: dict, hook: bool, working_dir: bool) -> None:
    job = {"env_vars": job_vars} | ({"worker_process_setup_hook": SETUP_HOOK} if hook else {})
    job |= {"working_dir": "gcs://_ray_pkg_x.zip"} if working_dir else {}
    path = job_vars.get("PYTHONPATH")
    if path is not None and str(REPO_ROOT) not in path.split(os.pathsep):
        with pytest.raises(RuntimeEnvConflict, match="without the repo root"):
            for_ray_job(OURS, job)
        return
    merged = ray_merge(job, for_ray_job(OURS, job))
    assert merged is not None  # no conflict: ray.init accepts it
    assert merged["worker_process_setup_hook"] == SETUP_HOOK
    for k, v in OURS["env_vars"].items():
        assert merged["env_vars"][k] == job_vars.get(k, v)  # the job's value where it set one, ours elsewhere
    assert merged.get("working_dir") == job.get("working_dir")


def test_another_setup_hook_is_refused_by_name() -> None:
    with pytest.raises(RuntimeEnvConflict, match=r"worker_process_setup_hook='mine.hook'.*verl_patches.prelude_patch"):
        for_ray_job(OURS, {"worker_process_setup_hook": "mine.hook"})


def test_the_job_runtime_env_is_read_from_rays_variable() -> None:
    assert ray_job_runtime_env({}) is None
    assert ray_job_runtime_env({RAY_JOB_CONFIG_ENV: json.dumps({"runtime_env": {"env_vars": {"A": "1"}}})}) == {
        "env_vars": {"A": "1"}
    }
    assert ray_job_runtime_env({RAY_JOB_CONFIG_ENV: json.dumps({"metadata": {}})}) == {}
    with pytest.raises(RuntimeEnvConflict, match=RAY_JOB_CONFIG_ENV):
        ray_job_runtime_env({RAY_JOB_CONFIG_ENV: "{not json"})


def test_ray_init_kwargs_joins_the_jobs_cluster_with_the_merged_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:29444")
    monkeypatch.setenv("VERL_PATCHES_QUIET", "1")  # forwarded by ours, and set by the job below
    monkeypatch.delenv(RAY_JOB_CONFIG_ENV, raising=False)
    assert ray_init_kwargs(None, "cpu") == {"address": "10.0.0.1:29444", "runtime_env": runtime_env()}
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps({"runtime_env": {"env_vars": {"VERL_PATCHES_QUIET": "1"}}}))
    kw = ray_init_kwargs(None, "cpu")
    assert kw["address"] == "10.0.0.1:29444" and "VERL_PATCHES_QUIET" not in kw["runtime_env"]["env_vars"]
    assert kw["runtime_env"]["worker_process_setup_hook"] == SETUP_HOOK
    assert set(kw) == {"address", "runtime_env"}  # never a local Ray, never num_cpus/num_gpus of its own
