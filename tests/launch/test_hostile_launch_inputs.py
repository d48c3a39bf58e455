"""Hostile and careless inputs to the launcher and its dry run (issue 27): env files that are folders, FIFOs or
devices; values that are data (no interpolation, nothing run); the dry run refusing every value the launch
refuses through the one shared check; strict integers; trackers and manifests in the preflight. Every
refusal is one line, nothing hangs, nothing is echoed from outside its folder."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_patches.base.strict_int import IntError, int_arg, parse_int
from verl_patches.launch import job
from verl_patches.launch.preflight import files as preflight_files
from verl_patches.launch.preflight import report as preflight
from verl_patches.launch.preflight.findings import FAIL, OK, Context, HostFacts
from verl_patches.launch.settings import (
    SettingsError,
    cluster_setting_problems,
    load_settings,
    read_env_file,
    validate_for_cluster,
)

ROOT = Path(__file__).resolve().parents[2]
GOOD = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "eth0", "NNODES": "16", "NPUS_PER_NODE": "16"}
A3 = "a3_256die_random_init"


@pytest.fixture(autouse=True)
def _no_cluster_env(monkeypatch):
    for name in (
        "MASTER_ADDR",
        "SOCKET_IFNAME",
        "NNODES",
        "NPUS_PER_NODE",
        "MODEL_PATH",
        "DATA_DIR",
        "DIST_CKPT_PATH",
        "RAY_DASHBOARD_HOST",
        "NODE_ROLE",
        "LOG_DIR",
    ):
        monkeypatch.delenv(name, raising=False)


def _err_line(capsys) -> str:
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    lines = [ln for ln in out.err.splitlines() if ln.strip()]
    assert len(lines) == 1, out.err
    return lines[0]


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "cluster.env"
    p.write_text(text)
    return p


# ---- --env-file that is not a regular file --------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize("kind", ["folder", "fifo", "device", "missing"])
def test_env_file_that_is_not_a_regular_file_is_one_line_and_never_blocks(tmp_path, capsys, kind):
    path = tmp_path / "cluster.env"
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)  # no writer: a plain read would block forever
    elif kind == "device":
        path = Path("/dev/zero")
    with pytest.raises(SettingsError) as e:
        read_env_file(path)
    word = {"folder": "a directory", "fifo": "FIFO", "device": "character device", "missing": "no such file"}[kind]
    assert word in str(e.value) and str(path) in str(e.value) and "\n" not in str(e.value)
    assert job.main(["--profile", A3, "--dry-run", "--env-file", str(path)]) == 2
    assert word in _err_line(capsys)
    assert preflight.main(["--profile", A3, "--env-file", str(path)]) == 2
    assert word in _err_line(capsys)


def test_a_control_character_in_the_env_file_is_refused_by_line(tmp_path):
    p = tmp_path / "cluster.env"
    p.write_bytes(b"NNODES=2\nMASTER_ADDR=10.0.0.1\x00\n")
    with pytest.raises(SettingsError, match=r"cluster.env:2: control character U\+0000"):
        read_env_file(p)


# ---- values are data ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["${broken", "/data/${oc.env:HOME}/x", "${trainer.nnodes}"])
def test_interpolation_text_in_a_config_path_is_refused_not_resolved(tmp_path, capsys, value):
    env = _write(tmp_path, f"MODEL_PATH='{value}'\n")
    s = load_settings({**GOOD}, env, environ={})
    assert s.get("MODEL_PATH") == value  # read as written: nothing expanded
    (problem,) = [p for p in cluster_setting_problems(s, needs_checkpoint=False) if p.name == "MODEL_PATH"]
    assert f"{env}:1" in problem.message and "'${'" in problem.message and not problem.missing
    assert job.main(["--profile", A3, "--dry-run", "--env-file", str(env)]) == 2
    line = _err_line(capsys)
    assert "MODEL_PATH=" in line and value[:8] in line
    flags = [f"--{k.lower().replace('_', '-')}={v}" for k, v in GOOD.items()]
    assert job.main(["--profile", A3, "--env-file", str(env), *flags]) == 2  # the launch: the same check
    assert "MODEL_PATH=" in capsys.readouterr().err


def test_pass_through_values_are_carried_literally(tmp_path):
    env = _write(tmp_path, "HCCL_DEBUG_NOTE='${x} $(reboot) `id`'\nVLLM_X=$HOME\n")
    s = load_settings({}, env, environ={})
    assert s.get("HCCL_DEBUG_NOTE") == "${x} $(reboot) `id`" and s.get("VLLM_X") == "$HOME"
    assert not [p for p in cluster_setting_problems(load_settings(GOOD, env, environ={}), False)]


def test_an_interpolation_reaching_the_config_another_way_is_one_line():
    from verl_patches.trainer.config_compose import ConfigCompositionError

    s = load_settings({}, None, environ={})
    with pytest.raises(ConfigCompositionError, match=r"data\.train_files='\$\{x\}'"):
        preflight.compose("ppo_mindspeed_trainer", [f"profile={A3}", "data.train_files='\\${x}'"], s, ROOT)


# ---- the dry run refuses what the launch refuses (one shared check) ------------------------------------------


@pytest.mark.parametrize(
    "setting,value,words",
    [
        ("RAY_DASHBOARD_HOST", "0.0.0.0", "--allow-remote-dashboard"),
        ("SOCKET_IFNAME", "eth0;reboot", "one network interface name"),
        ("SOCKET_IFNAME", "eth0,eth1", "one network interface name"),
        ("SOCKET_IFNAME", "a" * 16, "at most 15"),
        ("MASTER_PORT", "70000", "not a port number"),
        ("NODE_ROLE", "boss", "head, worker or auto"),
        ("WAIT_TIMEOUT_S", "１８００", "expected an integer"),
        ("MASTER_ADDR", "$(hostname)", "neither an IP address nor a host name"),
    ],
)
def test_every_value_the_launch_refuses_fails_the_dry_run(capsys, setting, value, words):
    s = load_settings({**GOOD, setting: value}, None, environ={})
    (launch_error,) = validate_for_cluster(s, needs_checkpoint=False)
    assert words in launch_error
    flag = f"--{setting.lower().replace('_', '-')}"
    assert job.main(["--profile", A3, "--dry-run", f"{flag}={value}"]) == 1
    verdict = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("preflight: ")][-1]
    assert verdict.startswith("preflight: FAIL") and "cluster.settings" in verdict.split("):")[-1]
    findings = preflight.run_preflight(
        preflight.compose("ppo_mindspeed_trainer", [f"profile={A3}"], s, ROOT), s, ROOT, HostFacts(device="cpu")
    )
    (f,) = [f for f in findings if f.check == "cluster.settings"]
    assert f.status == FAIL and f.message == launch_error and f.key == setting


def test_an_open_dashboard_passes_the_dry_run_only_with_the_flag_the_launch_needs(capsys):
    argv = ["--profile", A3, "--dry-run", "--ray-dashboard-host", "0.0.0.0", "--allow-remote-dashboard"]
    assert job.main([*argv, "--ckpt-dir", "/shared/ckpt/dsv3"]) == 0  # the A3 profiles' folder has no default
    assert "preflight: PASS" in capsys.readouterr().out


@pytest.mark.parametrize(
    "text",
    ["NNODES=16; rm -rf /tmp/x\n", "NNODES='16 && reboot'\n", "NPUS_PER_NODE=1e3\n", "NNODES=" + "9" * 5000 + "\n"],
    ids=["semicolon", "and", "float", "5000-digits"],
)
def test_a_non_integer_node_count_is_one_line_in_the_dry_run_and_the_launch(tmp_path, capsys, text):
    env = _write(tmp_path, text)
    assert job.main(["--profile", A3, "--dry-run", "--env-file", str(env)]) == 2
    line = _err_line(capsys)
    assert "expected an integer" in line and f"{env}:1" in line and len(line) < 400
    assert (
        job.main(["--profile", A3, "--env-file", str(env), "--master-addr", "10.0.0.1", "--socket-ifname", "eth0"]) == 2
    )
    line = _err_line(capsys)
    assert line.startswith("launch: cannot start: ") and "expected an integer" in line


@pytest.mark.parametrize(
    "override,key",
    [
        ("trainer.nnodes=abc", "trainer.nnodes"),
        ("trainer.nnodes=1.5", "trainer.nnodes"),
        ("data.train_batch_size=[1,2]", "data.train_batch_size"),
        ("trainer.n_gpus_per_node='16'", "trainer.n_gpus_per_node"),
    ],
)
def test_a_non_integer_config_override_is_one_line(capsys, override, key):
    assert job.main(["--profile", A3, "--dry-run", "--", override]) == 2
    line = _err_line(capsys)
    assert f"{key}=" in line and "expected an integer" in line
    assert preflight.main(["--profile", A3, override]) == 2
    assert f"{key}=" in _err_line(capsys)


# ---- trackers and manifests in the preflight --------------------------------------------------------------


def _ckpt_findings(root: Path) -> list:
    cfg = preflight.compose(
        "ppo_mindspeed_trainer",
        ["profile=a3_256die_true_weight", f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={root}"],
        load_settings({}, None, environ={}),
        ROOT,
    )
    ctx = Context(cfg, load_settings({}, None, environ={}), ROOT, HostFacts(device="cpu"))
    return [f for f in preflight_files.checkpoint_findings(ctx, {}) if f.check == "checkpoint.dist"]


def _tiny_ckpt(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    for t in range(4):
        for p in range(8):
            for e in range(8):
                d = root / "iter_0000001" / f"mp_rank_{t:02d}_{p:03d}_{e:03d}"
                d.mkdir(parents=True)
                (d / preflight_files.CKPT_FILE).write_bytes(b"")
    (root / preflight_files.TRACKER_FILE).write_text("1\n")
    return root


@pytest.mark.parametrize("content", ["²".encode(), b"9" * 5000, b"\xff\xfe", b"1\n2\n"])
def test_a_bad_tracker_is_one_failed_finding(tmp_path, content):
    root = _tiny_ckpt(tmp_path)
    (root / preflight_files.TRACKER_FILE).write_bytes(content)
    (f,) = _ckpt_findings(root)
    assert f.status == FAIL and preflight_files.TRACKER_FILE in f.message and "\n" not in f.message
    assert len(f.message) < 300


def test_a_symlinked_tracker_is_refused_and_its_target_not_echoed(tmp_path):
    root = _tiny_ckpt(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("s3cr3t-token")
    (root / preflight_files.TRACKER_FILE).unlink()
    os.symlink(secret, root / preflight_files.TRACKER_FILE)
    (f,) = _ckpt_findings(root)
    assert f.status == FAIL and "symbolic link" in f.message and "s3cr3t" not in f.message


def test_a_good_checkpoint_passes_and_a_tampered_manifest_fails_naming_the_key(tmp_path):
    root = _tiny_ckpt(tmp_path)
    assert [f.status for f in _ckpt_findings(root)] == [OK]
    layout = {
        "tp": 4,
        "pp": 8,
        "ep": 8,
        "num_layer_list": [7, 7, 8, 8, 8, 8, 8, 7],
        "moe_grouped_gemm": True,
        "moe_tp_extend_ep": True,
    }
    man = {"tool": "verl_patches.weights.hf_to_mcore", "layout": layout, "hf_config": None, "complete": True}
    (root / "conversion_manifest.json").write_text(json.dumps(man))
    assert [f.status for f in _ckpt_findings(root)] == [OK]
    man["layout"]["tp"] = "4; rm -rf /"
    (root / "conversion_manifest.json").write_text(json.dumps(man))
    (f,) = _ckpt_findings(root)
    assert f.status == FAIL and "key 'layout.tp'" in f.message
    shutil.rmtree(root / "iter_0000001")


# ---- 8. property: the env-file parser and the CLI integers against arbitrary input ----------------------------

_env_lines = st.lists(
    st.sampled_from(
        [
            "NNODES=2",
            "export MASTER_ADDR=10.0.0.1",
            "# c",
            "",
            "SOCKET_IFNAME='eth0'",
            "MODEL_PATH=${x}",
            "HCCL_X=\"a b\"",
            "RAY_DASHBOARD_HOST=0.0.0.0",
            "NODE_ROLE=",
            "BOGUS=1",
            "X",
            "NNODES='",
            "DATA_DIR=../../etc",
        ]
    )
    | st.text(max_size=30),
    max_size=6,
).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogatepass"))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=200) | _env_lines)
def test_property_env_file_is_data_or_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("env") / "cluster.env"
    path.write_bytes(data)
    try:
        values = read_env_file(path)
    except SettingsError as e:
        assert "\n" not in str(e) and len(str(e)) < 2000
        return
    for value, line in values.values():
        assert isinstance(value, str) and line >= 1
        assert not any(ord(c) < 0x20 and c != "\t" for c in value)
    s = load_settings({}, path, environ={})
    for p in cluster_setting_problems(s, needs_checkpoint=True):  # never raises: every problem is a line
        assert "\n" not in p.message
    env = (
        preflight.path_environment(s, ROOT)
        if not any(p.name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH") for p in cluster_setting_problems(s, False))
        else {}
    )
    assert all("${" not in v for v in env.values())


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=20) | st.from_regex(r"-?[0-9]{1,14}", fullmatch=True))
def test_property_cli_integers_are_ascii_digits_or_one_line(text):
    try:
        value = parse_int(text, "--tp")
    except IntError as e:
        assert str(e).startswith("--tp: ") and "\n" not in str(e)
        digits = text.removeprefix("-")
        assert not (digits.isascii() and digits.isdigit() and 0 < len(digits) <= 12)
        return
    assert value == int(text) and text.lstrip("-").isascii() and len(text.lstrip("-")) <= 12
    assert int_arg()(text) == value
