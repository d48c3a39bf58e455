"""The job's environment (reference §3): every variable has a consumer, the ones that claim a vendored
package are really read there, HCCL_IF_BASE_PORT is set once, the variables nothing reads are gone,
env-file pass-through wins, and jemalloc is found, explicit or disabled as asked."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from verl_patches.launch import job_env
from verl_patches.launch.job_env import as_dict, find_jemalloc, job_environment
from verl_patches.launch.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DROPPED = (
    "VLLM_ENABLE_MC2",
    "VLLM_ENABLE_FIX_ROUTE",
    "VLLM_ASCEND_ACL_OP_INIT_MODE",
    "VLLM_ENABLE_GRAPH_MODE",
    "D2D_DATA_TRANSFER",
    "PRINT_MEMORY",
    "PROFILE_UPDATE",
)
CLUSTER = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "enp189s0f0", "JEMALLOC_LIB": "none"}


def env_for(tmp_path: Path | None = None, env_file: str | None = None, vllm_dp: int = 64, **flags: str):
    path = None
    if env_file is not None:
        assert tmp_path is not None
        path = tmp_path / "cluster.env"
        path.write_text(env_file)
    return job_environment(load_settings({**CLUSTER, **flags}, path, environ={}), vllm_dp)


def test_hccl_if_base_port_exactly_once() -> None:
    names = [v.name for v in env_for()]
    assert names.count("HCCL_IF_BASE_PORT") == 1
    assert len(names) == len(set(names))  # no variable is set twice
    assert as_dict(env_for())["HCCL_IF_BASE_PORT"] == "64247"
    assert as_dict(env_for(HCCL_IF_BASE_PORT="50000"))["HCCL_IF_BASE_PORT"] == "50000"


@pytest.mark.parametrize("name", DROPPED)
def test_variables_nothing_reads_are_not_exported(name: str) -> None:
    assert name not in as_dict(env_for())
    assert name not in {v.name for v in job_env.STATIC_VARS}


def test_values_of_reference_section_3() -> None:
    d = as_dict(env_for(NNODES="16", NPUS_PER_NODE="16"))
    expected = {
        "RAY_DEDUP_LOGS": "0",
        "HYDRA_FULL_ERROR": "1",
        "MALLOC_MMAP_THRESHOLD_": "512768",
        "LCAL_COMM_ID": "127.0.0.1:27001",
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "ASCEND_LAUNCH_BLOCKING": "0",
        "ASCEND_GLOBAL_EVENT_ENABLE": "0",
        "ASCEND_SLOG_PRINT_TO_STDOUT": "0",
        "ASCEND_GLOBAL_LOG_LEVEL": "3",
        "HCCL_CONNECT_TIMEOUT": "600",
        "HCCL_EXEC_TIMEOUT": "600",
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "HCCL_BUFFSIZE": "300",
        "TASK_QUEUE_ENABLE": "2",
        "VLLM_USE_V1": "1",
        "VLLM_ASCEND_MODEL_EXECUTE_TIME_OBSERVE": "0",
        "VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE": "1",
        "VLLM_VERSION": "0.9.1",
        "WORLD_SIZE": "256",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29444",
        "VERL_PATCHES_VLLM_DP_BASE_PORT": "29444",
        "HCCL_SOCKET_IFNAME": "enp189s0f0",
        "GLOO_SOCKET_IFNAME": "enp189s0f0",
        "TP_SOCKET_IFNAME": "enp189s0f0",
        "VLLM_DP_SIZE": "64",
    }
    for k, v in expected.items():
        assert d.get(k) == v, k
    assert as_dict(env_for(vllm_dp=128))["VLLM_DP_SIZE"] == "128"
    assert "LD_PRELOAD" not in d  # JEMALLOC_LIB=none


def test_every_variable_names_its_consumer() -> None:
    for v in env_for():
        assert v.consumer.strip(), v.name


def _vendored_claims() -> list[tuple[str, str]]:
    claims = []
    for v in env_for():
        for pkg in re.findall(r"vendored:(\w+)", v.consumer):
            claims.append((v.name, pkg))
    return claims


def test_some_variables_claim_vendored_consumers() -> None:
    pkgs = {pkg for _, pkg in _vendored_claims()}
    assert {"vllm", "vllm_ascend", "megatron", "verl"} <= pkgs


@pytest.mark.parametrize("name, pkg", _vendored_claims())
def test_vendored_consumer_really_reads_the_variable(name: str, pkg: str) -> None:
    folder = ROOT / pkg
    if not folder.is_dir():
        pytest.skip(f"{pkg}/ is not set up here (bash setup_sources.sh)")
    hits = subprocess.run(["grep", "-rlw", "--include=*.py", "--", name, str(folder)], capture_output=True, text=True)
    assert hits.returncode == 0, f"{name} claims {pkg} reads it, but no file under {pkg}/ mentions it"


@pytest.mark.parametrize("name", DROPPED)
def test_dropped_variables_are_indeed_unread_by_the_vendored_trees(name: str) -> None:
    folders = [str(ROOT / p) for p in ("verl", "vllm", "vllm_ascend", "megatron") if (ROOT / p).is_dir()]
    if not folders:
        pytest.skip("no vendored tree is set up here")
    hits = subprocess.run(["grep", "-rlw", "--include=*.py", "--", name, *folders], capture_output=True, text=True)
    assert hits.stdout == "", f"{name} is read by {hits.stdout.split()} after all"


def test_env_file_pass_through_wins(tmp_path: Path) -> None:
    variables = env_for(
        tmp_path,
        "HCCL_BUFFSIZE=400\nVLLM_USE_V1=0\nASCEND_GLOBAL_LOG_LEVEL=1\nHCCL_NEW_KNOB=7\nRAY_DASHBOARD_HOST=0.0.0.0\n",
    )
    d = as_dict(variables)
    assert (d["HCCL_BUFFSIZE"], d["VLLM_USE_V1"], d["ASCEND_GLOBAL_LOG_LEVEL"], d["HCCL_NEW_KNOB"]) == (
        "400",
        "0",
        "1",
        "7",
    )
    names = [v.name for v in variables]
    assert len(names) == len(set(names))  # replaced, not duplicated
    by_name = {v.name: v for v in variables}
    assert "cluster.env:1" in by_name["HCCL_BUFFSIZE"].consumer
    assert "RAY_DASHBOARD_HOST" not in d  # a launcher setting, not a job variable


def test_hccl_if_base_port_from_env_file_still_once(tmp_path: Path) -> None:
    variables = env_for(tmp_path, "HCCL_IF_BASE_PORT=40000\n")
    assert [v.value for v in variables if v.name == "HCCL_IF_BASE_PORT"] == ["40000"]


def test_jemalloc_none_auto_explicit(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert find_jemalloc("none") is None and find_jemalloc("") is None and find_jemalloc(None) is None
    assert find_jemalloc("/opt/lib/libjemalloc.so.2") == "/opt/lib/libjemalloc.so.2"
    lib = tmp_path / "libjemalloc.so.2"
    lib.write_bytes(b"")
    monkeypatch.setattr(job_env, "JEMALLOC_CANDIDATES", (str(tmp_path / "missing.so.2"), str(lib)))
    assert find_jemalloc("auto") == str(lib)
    assert as_dict(env_for(JEMALLOC_LIB="auto"))["LD_PRELOAD"] == str(lib)
    assert as_dict(env_for(JEMALLOC_LIB="/x/libjemalloc.so.2"))["LD_PRELOAD"] == "/x/libjemalloc.so.2"
    assert "LD_PRELOAD" not in as_dict(env_for(JEMALLOC_LIB="none"))
    monkeypatch.setattr(job_env, "JEMALLOC_CANDIDATES", (str(tmp_path / "missing.so.2"),))
    assert find_jemalloc("auto") is None
    assert "LD_PRELOAD" not in as_dict(env_for(JEMALLOC_LIB="auto"))


def test_graph_mode_is_the_profiles_config_key_not_the_dropped_variable() -> None:
    """The vendor's VLLM_ENABLE_GRAPH_MODE=1 is replaced by a config key of the A3 profiles that reaches
    vllm-ascend through the engine arguments; nothing of ours reads the variable either."""
    from verl_patches.trainer.config_compose import compose_config, resolved

    cfg = resolved(compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"]))
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config.enabled is True
    hits = subprocess.run(
        ["grep", "-rlw", "--include=*.py", "VLLM_ENABLE_GRAPH_MODE", str(ROOT / "verl_patches")],
        capture_output=True,
        text=True,
    )
    # the preflight's vendor_env names it only to refuse or map it (issue 42), the registry to document it: it drives
    # nothing
    skip = ("job_env.py", "preflight/vendor_env.py", "env_registry.py")
    readers = [p for p in hits.stdout.split() if not p.endswith(skip)]
    assert readers == [], f"read by {readers}"


def test_dp_master_ports_come_from_the_launch_not_from_verls_master_port() -> None:
    """The workers' MASTER_PORT is verl's torch.distributed port; the DP ports' base is its own variable,
    the MASTER_PORT setting the preflight plans (+1 onwards)."""
    d = as_dict(env_for())
    assert d["VERL_PATCHES_VLLM_DP_BASE_PORT"] == d["MASTER_PORT"] == "29444"


def test_the_tiny_run_hands_out_a_free_block_outside_the_ephemeral_range_unless_given() -> None:
    from verl_patches.base.free_port import ephemeral_range, port_is_free
    from verl_patches.launch.job import tiny_rollout_env
    from verl_patches.rollout.dp_env import DpEnvError
    from verl_patches.trainer.profiles import TINY_CONFIG
    from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV as BASE_PORT_ENV

    asked: list[tuple[int, str]] = []

    def pick(count: int, host: str) -> int:
        asked.append((count, host))
        return 20001

    got = tiny_rollout_env(TINY_CONFIG, [], {"HCCL_SOCKET_IFNAME": "lo"}, pick)
    # ppo_tiny_local: 4 ranks, rollout TP1, DP2 -> 2 instances x TP1 = 2 DP groups, masters on this host
    assert (got["VLLM_DP_SIZE"], got[BASE_PORT_ENV], asked) == ("2", "20000", [(2, "127.0.0.1")])
    assert BASE_PORT_ENV not in tiny_rollout_env(TINY_CONFIG, [], {BASE_PORT_ENV: "25000"}, pick)  # the user's stays
    with pytest.raises(DpEnvError, match=rf"{BASE_PORT_ENV}='2500o': expected an integer"):
        tiny_rollout_env(TINY_CONFIG, [], {BASE_PORT_ENV: "2500o"}, pick)  # refused at launch, named
    with pytest.raises(DpEnvError, match=rf"{BASE_PORT_ENV}=65534: its 2 DP master ports 65535..65536 run past"):
        tiny_rollout_env(TINY_CONFIG, [], {BASE_PORT_ENV: "65534"}, pick)  # so is a block past 65535
    with pytest.raises(DpEnvError, match=r"VLLM_DP_MASTER_PORT='25001' \(environment\) is set by hand"):
        tiny_rollout_env(TINY_CONFIG, [], {"VLLM_DP_MASTER_PORT": "25001"}, pick)  # DP2: no rank would know its own
    assert BASE_PORT_ENV not in tiny_rollout_env(TINY_CONFIG, ["overlay.vllm_dp_size=1"], {}, pick)
    asked.clear()
    tiny_rollout_env(TINY_CONFIG, ["trainer.n_gpus_per_node=8", "overlay.vllm_dp_size=2"], {}, pick)
    assert asked[0][0] == 4

    base = int(tiny_rollout_env(TINY_CONFIG, [], {"HCCL_SOCKET_IFNAME": "lo"})[BASE_PORT_ENV])  # the real picker
    low, high = ephemeral_range()
    for p in (base + 1, base + 2):
        assert (p < low or p > high) and not 10001 <= p <= 19999, p  # nor Ray's worker ports
        assert port_is_free("127.0.0.1", p)
