"""The environment every process of an A3 job gets (vendor reference §3), minus what nothing reads.

Each variable names its consumer. Dropped from the vendor's list because nothing in our stack reads
them at the pinned versions: VLLM_ENABLE_MC2, VLLM_ENABLE_FIX_ROUTE, VLLM_ASCEND_ACL_OP_INIT_MODE
(not referenced by vllm-ascend), VLLM_ENABLE_GRAPH_MODE (graph mode is the A3 profiles' config key
``actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.enabled``, which
reaches vllm-ascend through the engine arguments; nothing reads the variable). Not exported by the job because
they are opt-in overrides, forwarded to the workers only when the user sets them (patching.ray_runtime):
D2D_DATA_TRANSFER (read by the driver's step plan, verl_patches.driver.step_plan; it overrides the config key
``overlay.d2d_tensor_cache``, which turns the D2D tensor cache on for the A3 profiles), PRINT_MEMORY
(verl_patches.tools) and PROFILE_UPDATE (verl_patches.profiler). HCCL_IF_BASE_PORT is set once (the vendor
set it twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from verl_patches.launch.settings import ClusterSettings
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV

JEMALLOC_CANDIDATES = (
    "/usr/lib64/libjemalloc.so.2",
    "/usr/local/lib/libjemalloc.so.2",
    "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
    "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
)


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: str
    consumer: str  # who reads it; "vendored:<pkg>" ones are checked against the vendored trees by a test


STATIC_VARS: tuple[EnvVar, ...] = (
    EnvVar("RAY_DEDUP_LOGS", "0", "Ray: print every worker's log lines"),
    EnvVar("HYDRA_FULL_ERROR", "1", "Hydra: full tracebacks"),
    EnvVar("MALLOC_MMAP_THRESHOLD_", "512768", "glibc malloc"),
    EnvVar("LCAL_COMM_ID", "127.0.0.1:27001", "Ascend LCAL rendezvous"),
    EnvVar("CUDA_DEVICE_MAX_CONNECTIONS", "1", "vendored:megatron (SP/overlap ordering), torch_npu"),
    EnvVar("PYTORCH_NPU_ALLOC_CONF", "expandable_segments:True", "torch_npu allocator; enables empty_virt_addr_cache"),
    EnvVar("ASCEND_LAUNCH_BLOCKING", "0", "CANN runtime"),
    EnvVar("ASCEND_GLOBAL_EVENT_ENABLE", "0", "CANN logging"),
    EnvVar("ASCEND_SLOG_PRINT_TO_STDOUT", "0", "CANN logging"),
    EnvVar("ASCEND_GLOBAL_LOG_LEVEL", "3", "CANN logging (3 = ERROR)"),
    EnvVar("HCCL_CONNECT_TIMEOUT", "600", "HCCL"),
    EnvVar("HCCL_EXEC_TIMEOUT", "600", "HCCL"),
    EnvVar("HCCL_OP_EXPANSION_MODE", "AIV", "HCCL (AIV expansion, part of the vendor's 162 -> 419 tok/s step)"),
    EnvVar("HCCL_BUFFSIZE", "300", "HCCL buffer size in MB"),
    EnvVar("TASK_QUEUE_ENABLE", "2", "torch_npu level-2 task queue"),
    EnvVar("VLLM_USE_V1", "1", "vendored:vllm (V1 engine)"),
    EnvVar("VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE", "0", "vendored:vllm_ascend"),
    EnvVar("VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE", "1", "vendored:vllm_ascend (top-k sampler)"),
    EnvVar("VLLM_VERSION", "0.9.1", "vendored:vllm_ascend (version override)"),
)


def rollout_engine_environment() -> dict[str, str]:
    """The variables vLLM and vllm-ascend read (``vendored:vllm*``): every run whose rollout is vllm-ascend's
    engine exports them, the tiny run on a CPU host included, so its engine takes A3's code paths (V1 engine,
    vllm-ascend's top-k/top-p sampler)."""
    return {v.name: v.value for v in STATIC_VARS if v.consumer.startswith(("vendored:vllm ", "vendored:vllm_ascend"))}


def find_jemalloc(setting: str | None) -> str | None:
    if setting in (None, "", "none"):
        return None
    if setting != "auto":
        return setting
    return next((p for p in JEMALLOC_CANDIDATES if Path(p).exists()), None)


def job_environment(settings: ClusterSettings, vllm_dp_size: int) -> list[EnvVar]:
    """Every variable the job exports, in a stable order, with its consumer."""
    ifname = settings.get("SOCKET_IFNAME") or ""
    out = list(STATIC_VARS) + [
        EnvVar("HCCL_IF_BASE_PORT", settings.get("HCCL_IF_BASE_PORT") or "64247", "HCCL host NIC ports"),
        EnvVar("WORLD_SIZE", str(settings.world_size), "vendored:verl, torch.distributed"),
        EnvVar("MASTER_ADDR", settings.get("MASTER_ADDR") or "", "vendored:verl (Ray head), torch.distributed"),
        EnvVar("MASTER_PORT", settings.get("MASTER_PORT") or "29444", "vendored:verl (Ray head port)"),
        # not MASTER_PORT itself: verl's workers replace that with torch.distributed's port
        EnvVar(
            DP_BASE_PORT_ENV,
            settings.get("MASTER_PORT") or "29444",
            "verl_patches.rollout.dp_env (vLLM DP master ports: this + 1 onwards, as the preflight plans them)",
        ),
        EnvVar("HCCL_SOCKET_IFNAME", ifname, "HCCL"),
        EnvVar("GLOO_SOCKET_IFNAME", ifname, "torch gloo"),
        EnvVar("TP_SOCKET_IFNAME", ifname, "torch TensorPipe"),
        EnvVar("VLLM_DP_SIZE", str(vllm_dp_size), "vendored:vllm_ascend (DP size per vLLM instance)"),
    ]
    jemalloc = find_jemalloc(settings.get("JEMALLOC_LIB"))
    if jemalloc:
        out.append(EnvVar("LD_PRELOAD", jemalloc, "dynamic loader: jemalloc for the host-side allocator"))
    for key, value in settings.values.items():  # HCCL_*/ASCEND_*/VLLM_*/RAY_*/PYTORCH_* from the env file win
        if key.startswith(("HCCL_", "ASCEND_", "VLLM_", "RAY_", "PYTORCH_")) and key not in (
            "RAY_DASHBOARD_HOST",
            "RAY_DASHBOARD_PORT",
        ):
            out = [v for v in out if v.name != key] + [EnvVar(key, value, f"env file ({settings.where(key)})")]
    out.append(collective_watchdog_timeout(out))
    out += hccl_flight_recorder(out, settings.values)
    return out


def collective_watchdog_timeout(variables: list[EnvVar]) -> EnvVar:
    """The hang watchdog fires a little before HCCL's own execution time-out, which ends the job without
    naming the stuck rank; it follows HCCL_EXEC_TIMEOUT as the env file sets it."""
    hccl = next((v for v in variables if v.name == "HCCL_EXEC_TIMEOUT"), None)
    try:
        seconds = int(hccl.value) if hccl is not None else 600
    except ValueError:
        seconds = 600
    return EnvVar(
        "VERL_PATCHES_COLLECTIVE_TIMEOUT_S",
        str(max(30, seconds * 9 // 10)),
        f"verl_patches.resilience (hang diagnosis; 90% of HCCL_EXEC_TIMEOUT={seconds})",
    )


# torch_npu 2.5.1.post1's ProcessGroupHCCL reads these (ProcessGroupHCCL.hpp at v7.1.0-pytorch2.5.1); all off
# by default there. With them a rank whose HCCL work is outstanding HCCL_EXEC_TIMEOUT-60 s, or any rank the
# driver's hang report signals (verl_patches.resilience.worker_deadline), dumps its flight recorder.
FLIGHT_RECORDER_FILE = "/tmp/hccl_trace_rank_"


def hccl_flight_recorder(variables: list[EnvVar], user: dict[str, str]) -> list[EnvVar]:
    """torch_npu's HCCL monitor and flight recorder, unless the env file sets a variable itself; the
    monitor's heartbeat time-out stays below HCCL_EXEC_TIMEOUT (torch_npu's flight recorder guide)."""
    timeout = next(v.value for v in variables if v.name == "VERL_PATCHES_COLLECTIVE_TIMEOUT_S")
    wanted = (
        EnvVar("TORCH_HCCL_ENABLE_MONITORING", "1", "torch_npu ProcessGroupHCCL: heartbeat monitor thread (dumps)"),
        EnvVar(
            "TORCH_HCCL_DUMP_ON_TIMEOUT",
            "1",
            "torch_npu ProcessGroupHCCL: dump the flight recorder on a time-out or the dump signal",
        ),
        EnvVar(
            "TORCH_HCCL_TRACE_BUFFER_SIZE",
            "2000",
            "torch_npu ProcessGroupHCCL: flight recorder entries (torch_npu's default 0 records nothing)",
        ),
        EnvVar(
            "TORCH_HCCL_HEARTBEAT_TIMEOUT_SEC",
            timeout,
            "torch_npu ProcessGroupHCCL: monitor time-out, below HCCL_EXEC_TIMEOUT",
        ),
        EnvVar(
            "TORCH_HCCL_DEBUG_INFO_TEMP_FILE",
            FLIGHT_RECORDER_FILE,
            "torch_npu ProcessGroupHCCL: dump file "
            "prefix (<prefix><rank>, <prefix><rank>_py_traceback), named by the hang report",
        ),
    )
    return [EnvVar(v.name, user[v.name], "env file") if v.name in user else v for v in wanted]


def as_dict(variables: list[EnvVar]) -> dict[str, str]:
    return {v.name: v.value for v in variables}
