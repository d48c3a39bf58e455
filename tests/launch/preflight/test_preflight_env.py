"""The dry run refuses what the job would die on (issue 41 item 5): every registered variable the job would see is
parsed by the registry's parser, the one the job's getters use, and a bad value is refused in one line naming the
variable, the value and what is accepted; a misspelt variable of ours is named with the closest registered one;
``VLLM_DP_MASTER_PORT`` is named for what it turns off; a DP port block past 65535 is refused; the launch refuses
the same before it starts anything, and the device override is one line, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.base import env_registry
from verl_patches.base.env_flags import EnvError
from verl_patches.launch import job
from verl_patches.launch.preflight import report as preflight
from verl_patches.launch.preflight.env import (
    CHECK,
    Seen,
    dp_master_port_findings,
    seen_variables,
    variable_findings,
)
from verl_patches.launch.preflight.findings import FAIL, OK, WARN, HostFacts
from verl_patches.launch.preflight.host import local_dp_port_findings, vllm_dp_port_count
from verl_patches.launch.preflight.report import compose, run_preflight
from verl_patches.launch.settings import load_settings
from verl_patches.reshard.layout import RolloutLayout
from verl_patches.resilience.timeout import configured_timeout
from verl_patches.rollout.dp_env import DpEnvError, all_group_ports, port_block
from verl_patches.trainer.profiles import PROFILES

ROOT = Path(__file__).resolve().parents[3]
CPU = HostFacts(device="cpu")
SCRIPT = ROOT / "verl_patches/scripts/train_deepseekv3_256die_random_init.sh"

# issue 41, class 5: each passed the dry run and killed the job (or was a traceback)
KNOWN = {
    "VERL_PATCHES_QUIET": "2",
    "PRINT_MEMORY": "enabled",
    "NO_ALL_TO_ALL_RESHARD": "2",
    "PROFILE_UPDATE": "ture",
    "VERL_PATCHES_COLLECTIVE_TIMEOUT_S": "abc",
    "VERL_PATCHES_DEVICE": "NPU",
}


def env(**values: str) -> dict[str, Seen]:
    return {n: Seen(n, v, "environment") for n, v in values.items()}


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch):
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", *KNOWN, "VLLM_DP_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CKPT_DIR", "/shared/ckpt/dsv3")


@cache
def cfg_for(profile: str, *overrides: str):
    p = PROFILES[profile]
    return compose(p.config_name, [*p.overrides, *overrides], load_settings({}, None, {}), ROOT)


@pytest.mark.parametrize("name, value", sorted(KNOWN.items()))
def test_each_known_failure_is_refused_in_one_line_as_the_job_refuses_it(name: str, value: str) -> None:
    (f,) = variable_findings(env(**{name: value}))
    assert (f.check, f.status, f.key) == (CHECK, FAIL, name)
    assert "\n" not in f.message and f.message.startswith(f"{name}={value!r}: expected ")
    with pytest.raises(EnvError) as job_said:  # the job's own getter, with the registered kind
        env_registry.read(name, {name: value})
    assert f.message == f"{job_said.value} (environment)"


def test_the_refusal_is_the_jobs_own_error_at_its_read_sites() -> None:
    (f,) = variable_findings(env(VERL_PATCHES_COLLECTIVE_TIMEOUT_S="abc"))
    with pytest.raises(EnvError) as e:
        configured_timeout({"VERL_PATCHES_COLLECTIVE_TIMEOUT_S": "abc"})  # the driver's hang watchdog
    assert f.message.startswith(str(e.value))
    (f,) = variable_findings(env(VERL_PATCHES_COLLECTIVE_TIMEOUT_S="-1"))
    assert f.status == FAIL and "must be at least 0" in f.message


def test_a_switch_lists_every_accepted_spelling() -> None:
    (f,) = variable_findings(env(PRINT_MEMORY="enabled"))
    for spelling in ("1", "true", "yes", "on", "0", "false", "no", "off", "empty"):
        assert spelling in f.message


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(n for n in env_registry.REGISTRY if not env_registry.REGISTRY[n].family)),
    value=st.one_of(
        st.sampled_from(["", " ", "0", "1", "on", "off", "ture", "2", "-1", "1e9", "nan", "inf", "npu", "NPU", "a,b"]),
        st.text(max_size=8),
    ),
)
def test_the_dry_run_refuses_exactly_what_the_job_refuses(name: str, value: str) -> None:
    """Over every registered variable and arbitrary values: the preflight refuses a value exactly when the job's
    getter (`env_registry.read`, what `flag`, `integer`, ... parse with) raises, and with its message."""
    var = env_registry.REGISTRY[name]
    if not value.strip() and var.default is None:
        return  # set but empty, no default: not a value to refuse; the reader says what it needs ("not set")
    try:
        env_registry.read(name, {name: value})
        job_refuses = None
    except EnvError as err:
        job_refuses = str(err)
    assert env_registry.problem(name, value) == job_refuses
    found = variable_findings(env(**{name: value}), dp_size=1)
    if var.judged_by:
        return  # judged by its own check (env.vendor, local.dp_ports, the DP master port rule)
    assert [f.message for f in found if f.status == FAIL] == ([f"{job_refuses} (environment)"] if job_refuses else [])


def test_a_misspelt_variable_of_ours_is_named_with_the_closest_registered_one() -> None:
    (f,) = variable_findings(env(VERL_PATCHES_QUITE="1"))
    assert f.status == WARN and "did you mean VERL_PATCHES_QUIET?" in f.message and f.key == "VERL_PATCHES_QUITE"
    (f,) = variable_findings(env(VERL_OVERLAY_GIT_TIMOUT="60"))
    assert "did you mean VERL_OVERLAY_GIT_TIMEOUT?" in f.message
    (f,) = variable_findings(env(VERL_PATCHES_SOMETHING_ELSE_ENTIRELY="1"))
    assert f.status == WARN and "nothing reads it" in f.message
    assert variable_findings(env(VERL_OVERLAY_GIT_MIRROR_VERL="https://example.org/verl.git"))[0].status == OK
    assert "OTHER_TOOL_SETTING" not in seen_variables(None, {"OTHER_TOOL_SETTING": "x"})  # not ours: not judged


def test_a_secret_is_never_shown() -> None:
    found = variable_findings(env(VERL_PATCHES_CHECK_TOKEN="s3cret-token", VERL_PATCHES_CHECK_TOKN="other-secret"))
    assert not any("s3cret" in f.message or "other-secret" in f.message for f in found)


def test_vllm_dp_master_port_is_named_for_what_it_turns_off() -> None:
    (f,) = dp_master_port_findings(env(VLLM_DP_MASTER_PORT="25001"), 2)
    assert f.status == FAIL and f.key == "VLLM_DP_MASTER_PORT"
    assert "turns off the per-rank export" in f.message and "verl_hooks" in f.message and "DP rank 0" in f.message
    (f,) = dp_master_port_findings(env(VLLM_DP_MASTER_PORT="25001"), 1)
    assert f.status == WARN and "nothing reads it" in f.message
    assert dp_master_port_findings(env(), 64) == []
    assert [f.status for f in variable_findings(env(VLLM_DP_MASTER_PORT="25001"), dp_size=64)] == [FAIL]
    assert variable_findings(env(VLLM_DP_MASTER_PORT="25001"))[0].status == OK  # config unknown: judged later


def test_the_cluster_dp_base_port_in_the_environment_is_named_as_ignored() -> None:
    (f,) = variable_findings(env(VERL_PATCHES_VLLM_DP_BASE_PORT="30000"), dp_size=64, cluster=True)
    assert f.status == WARN and "ignored on the cluster" in f.message and f.key == "MASTER_PORT"


def test_the_env_files_lines_win_and_name_their_line(tmp_path: Path) -> None:
    path = tmp_path / "cluster.env"
    path.write_text("MASTER_ADDR=10.0.0.1\nVLLM_DP_RANK=first\nVLLM_DP_MASTER_PORT=30001\n")
    s = load_settings({}, path, environ={})
    seen = seen_variables(s, {"VLLM_DP_RANK": "0"})
    assert seen["VLLM_DP_RANK"].where == f"{path}:2"
    found = variable_findings(seen, dp_size=64, cluster=True)
    assert {(f.key, f.status) for f in found} == {("VLLM_DP_RANK", FAIL), ("VLLM_DP_MASTER_PORT", FAIL)}
    assert any("VLLM_DP_RANK='first': expected an integer" in f.message and f"{path}:2" in f.message for f in found)


@settings(max_examples=200, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4, 8]),
    dp=st.sampled_from([2, 4, 8, 16]),
    instances=st.integers(1, 4),
    base=st.integers(1023, 65534),
)
def test_the_port_block_is_the_jobs_block(tp: int, dp: int, instances: int, base: int) -> None:
    """`port_block` refuses exactly the bases whose DP groups' ports (`all_group_ports`, as every rank computes
    them) run past 65535, and covers exactly those ports."""
    layout = RolloutLayout(world_size=tp * dp * instances, tp=tp, dp_per_instance=dp)
    groups = instances * tp
    try:
        ports = sorted(all_group_ports(layout, base).values())
    except DpEnvError:
        ports = None
    if ports is None:
        with pytest.raises(DpEnvError, match=rf"VERL_PATCHES_VLLM_DP_BASE_PORT={base}: its {groups} DP master ports"):
            port_block(base, groups)
    else:
        assert list(port_block(base, groups)) == ports


def test_the_tiny_dry_run_refuses_a_dp_block_past_65535() -> None:
    cfg = cfg_for("tiny")
    n = vllm_dp_port_count(cfg)
    (f,) = local_dp_port_findings({"VERL_PATCHES_VLLM_DP_BASE_PORT": str(65535 - n)}, cfg)
    assert f.status == OK
    (f,) = local_dp_port_findings({"VERL_PATCHES_VLLM_DP_BASE_PORT": str(65536 - n)}, cfg)
    assert f.status == FAIL and f.key == "VERL_PATCHES_VLLM_DP_BASE_PORT" and "run past 65535" in f.message
    cfg1 = cfg_for("tiny", "overlay.vllm_dp_size=1")  # no DP group: no port is taken
    assert local_dp_port_findings({"VERL_PATCHES_VLLM_DP_BASE_PORT": "65534"}, cfg1)[0].status == OK


def test_the_preflight_reports_them(monkeypatch) -> None:
    for name, value in KNOWN.items():
        if name != "VERL_PATCHES_DEVICE":  # the host probe itself stops on that one: test_the_device_override_...
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("VERL_PATCHES_QUITE", "1")
    found = [f for f in run_preflight(cfg_for("tiny"), load_settings({}, None, {}), ROOT, CPU) if f.check == CHECK]
    assert sorted(f.key for f in found if f.status == FAIL) == sorted(n for n in KNOWN if n != "VERL_PATCHES_DEVICE")
    assert [f.key for f in found if f.status == WARN] == ["VERL_PATCHES_QUITE"]
    monkeypatch.setenv("VLLM_DP_MASTER_PORT", "30001")
    found = run_preflight(cfg_for("tiny"), load_settings({}, None, {}), ROOT, CPU)
    assert any(f.key == "VLLM_DP_MASTER_PORT" and f.status == FAIL for f in found)


def test_the_launch_refuses_them_before_starting_anything(monkeypatch, capsys) -> None:
    def never(*_a, **_k):
        raise AssertionError("started")

    monkeypatch.setattr(job, "run_tiny", never)
    monkeypatch.setattr(job, "run_cluster", never)
    monkeypatch.setenv("VERL_PATCHES_QUIET", "2")
    assert job.main(["--profile", "a3_256die_random_init", "--tiny"]) == 2
    err = capsys.readouterr().err
    assert "launch: cannot start:" in err and "VERL_PATCHES_QUIET='2': expected 1, true" in err
    monkeypatch.delenv("VERL_PATCHES_QUIET")
    monkeypatch.setenv("VERL_PATCHES_DEVICE", "NPU")
    assert job.main(["--profile", "a3_256die_random_init", "--tiny"]) == 2
    err = capsys.readouterr().err
    assert "VERL_PATCHES_DEVICE='NPU': expected npu, cuda or cpu" in err and "Traceback" not in err
    monkeypatch.setenv("VERL_OVERLAY_DEVICE", "npu")
    monkeypatch.delenv("VERL_PATCHES_DEVICE")
    assert preflight.main(["--profile", "tiny"]) == 2
    assert "VERL_OVERLAY_DEVICE='npu': this variable is no longer read" in capsys.readouterr().err


@pytest.mark.parametrize(
    "variable, value, status, line",
    [
        ("VERL_PATCHES_QUIET", "2", 1, "VERL_PATCHES_QUIET='2': expected 1, true, yes, on (on)"),
        ("VERL_PATCHES_DEVICE", "NPU", 2, "launch: VERL_PATCHES_DEVICE='NPU': expected npu, cuda or cpu"),
    ],
)
def test_the_scripts_dry_run(variable: str, value: str, status: int, line: str) -> None:
    """README's command: ``train_deepseekv3_256die_random_init.sh --tiny --dry-run`` (about 10 s on 2 cores)."""
    environ = {k: v for k, v in os.environ.items() if k not in KNOWN}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--tiny", "--dry-run"],
        env={**environ, variable: value, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    out = done.stdout + done.stderr
    assert done.returncode == status and "Traceback" not in out, out[-3000:]
    assert line in " ".join(out.split())
