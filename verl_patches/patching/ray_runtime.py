"""The Ray runtime environment every job process gets, so that our patches are active in all of them.

Ray workers are fresh interpreters: they import verl's worker classes by reference and would never
see our prelude unless told to. `worker_process_setup_hook` runs the prelude in every worker before
any task, and PYTHONPATH makes the repo root (verl_patches and the vendored trees) importable there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from verl_patches.base.job_layout import cluster_of

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_HOOK = "verl_patches.prelude_patch.activate"

# What verl v0.4.0's own run_ppo passes to ray.init; kept so our start of Ray changes nothing else.
UPSTREAM_ENV_VARS = {
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "VLLM_LOGGING_LEVEL": "WARN",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "true",
}

# Switches read inside the workers (not by the driver): a worker joining a cluster started by someone else
# inherits that raylet's environment, not ours, so they travel in the runtime env explicitly.
FORWARDED_PREFIXES = ("VERL_PATCHES_", "VERL_OVERLAY_", "VLLM_", "HCCL_", "ASCEND_", "PYTORCH_NPU_") + (
    # trainer.logger's backends (keys, hosts, modes) for the driver's Ray process (verl's TaskRunner), which
    # Ray may place on any node: set on the head, they need not be exported on every node
    "WANDB_",
    "SWANLAB_",
    "MLFLOW_",
    "CLEARML_",
)
FORWARDED_NAMES = frozenset(
    {
        "D2D_DATA_TRANSFER",  # verl_patches.driver.step_plan / reshard.tensor_cache (A2/C2)
        "PRINT_MEMORY",  # verl_patches.tools (C8)
        "PROFILE_UPDATE",  # verl_patches.profiler (C9)
        "NO_ALL_TO_ALL_RESHARD",  # verl_patches.sync.path (E2/E3 vs the all-gather path)
        "TASK_QUEUE_ENABLE",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "LCAL_COMM_ID",
        "MALLOC_MMAP_THRESHOLD_",
        "TENSORBOARD_DIR",
    }
)


def forwarded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The variables of `environ` (default: this process) that every worker must see (pure)."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES)}


def worker_pythonpath() -> str:
    from verl_patches.sources.dist_info import path_entry  # vllm/vllm_ascend metadata and entry points

    ours = [str(REPO_ROOT), path_entry(REPO_ROOT)]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join(ours + [p for p in current if p not in ours])


def runtime_env(extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    env = dict(UPSTREAM_ENV_VARS)
    env["PYTHONPATH"] = worker_pythonpath()
    env.update(forwarded_env())
    env.update(extra_env or {})
    return {"env_vars": env, "worker_process_setup_hook": SETUP_HOOK}


# Set by Ray's job supervisor for the entrypoint of `ray job submit`: the job's runtime env, which ray.init merges
# with the driver's own and refuses when both set one field or one variable (ray/_private/worker.py, Ray 2.46)
RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"


class RuntimeEnvConflict(ValueError):
    """The runtime env of a `ray job submit` would keep our prelude from the workers; one line saying how."""


def ray_job_runtime_env(environ: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The runtime env of the Ray job this driver runs in (`ray job submit`), None outside one."""
    raw = (os.environ if environ is None else environ).get(RAY_JOB_CONFIG_ENV)
    if not raw:
        return None
    try:
        job = json.loads(raw).get("runtime_env") or {}
    except (ValueError, AttributeError):
        raise RuntimeEnvConflict(f"{RAY_JOB_CONFIG_ENV} is not the JSON Ray's job supervisor writes") from None
    return job if isinstance(job, dict) else {}


def for_ray_job(ours: dict[str, Any], job: dict[str, Any]) -> dict[str, Any]:
    """Our runtime env as the driver of a Ray job passes it to ray.init (pure).

    Ray merges the job's runtime env (``ray job submit --runtime-env ...``) with the driver's and refuses a field
    or variable that both set. The job's values are the submitter's and already this process's environment, so
    ours gives way on every variable the job sets; what must survive is that workers run the prelude: the job may
    not name another setup hook, nor a PYTHONPATH without the repo root (workers could not import it)."""
    job_vars = job.get("env_vars") or {}
    hook = job.get("worker_process_setup_hook")
    if hook is not None and hook != ours.get("worker_process_setup_hook"):
        raise RuntimeEnvConflict(
            f"the job's runtime env sets worker_process_setup_hook={hook!r}: Ray workers would not run our prelude "
            f"({SETUP_HOOK}); leave it out of ray job submit's --runtime-env"
        )
    path = job_vars.get("PYTHONPATH")
    if path is not None and str(REPO_ROOT) not in str(path).split(os.pathsep):
        raise RuntimeEnvConflict(
            f"the job's runtime env sets PYTHONPATH={str(path)!r} without the repo root {REPO_ROOT}: Ray workers "
            "could not import our prelude; leave PYTHONPATH out of ray job submit's --runtime-env or put the repo "
            "root in it"
        )
    out = {k: v for k, v in ours.items() if k != "env_vars" and k not in job}
    env_vars = {k: v for k, v in (ours.get("env_vars") or {}).items() if k not in job_vars}
    if env_vars:
        out["env_vars"] = env_vars
    return out


def ray_init_kwargs(config: Any, device: str) -> dict[str, Any]:
    """Arguments for ray.init from a verl config, on this device.

    On a CPU host Ray offers one logical GPU slot per configured worker: verl's resource pools are
    expressed in GPUs, and the slots only decide placement (no CUDA is used).
    """
    if os.environ.get("RAY_ADDRESS"):  # a cluster our launcher (or the user) started: join it as is
        job = ray_job_runtime_env()  # started by `ray job submit`: the job's runtime env is merged with ours
        env = runtime_env() if job is None else for_ray_job(runtime_env(), job)
        return {"address": os.environ["RAY_ADDRESS"], "runtime_env": env}
    # A fresh local Ray, never whatever cluster happens to run on this machine (address="local").
    kwargs: dict[str, Any] = {"address": "local", "runtime_env": runtime_env(), "include_dashboard": False}
    ray_init = config.get("ray_init", {}) if hasattr(config, "get") else {}
    num_cpus = ray_init.get("num_cpus") if ray_init else None
    if num_cpus is not None:
        kwargs["num_cpus"] = num_cpus
    if device == "cpu":
        kwargs["num_gpus"] = cluster_of(config).world
    return kwargs
