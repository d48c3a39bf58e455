"""Cluster settings of a launch (vendor item K1, issue 5 item 3): flags win over the env file, which wins
over the environment, which wins over the documented defaults; env-file errors name file and line; a
missing or placeholder master address is an error naming MASTER_ADDR, never used as an address."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.launch.settings import (
    SETTING_NAMES,
    SETTINGS,
    SettingsError,
    describe_settings,
    load_settings,
    read_env_file,
    validate_address,
    validate_for_cluster,
)

GOOD = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "enp189s0f0", "DIST_CKPT_PATH": "/ckpt"}


def write(tmp_path: Path, text: str, name: str = "cluster.env") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


# ---- precedence -------------------------------------------------------------------------------------


def test_precedence_flag_over_file_over_environment_over_default(tmp_path: Path) -> None:
    env_file = write(tmp_path, "MASTER_PORT=2000\nNNODES=4\nNPUS_PER_NODE=8\n")
    environ = {"MASTER_PORT": "3000", "NNODES": "2", "WAIT_TIMEOUT_S": "60"}
    s = load_settings({"MASTER_PORT": "1000"}, env_file, environ=environ)
    assert (s.get("MASTER_PORT"), s.where("MASTER_PORT")) == ("1000", "flag")
    assert (s.get("NNODES"), s.where("NNODES")) == ("4", f"{env_file}:2")
    assert (s.get("WAIT_TIMEOUT_S"), s.where("WAIT_TIMEOUT_S")) == ("60", "environment")
    assert (s.get("RAY_DASHBOARD_HOST"), s.where("RAY_DASHBOARD_HOST")) == ("127.0.0.1", "default")
    assert s.world_size == 4 * 8


def test_documented_defaults() -> None:
    s = load_settings({}, None, environ={})
    defaults = {x.name: x.default for x in SETTINGS}
    for name in SETTING_NAMES:
        assert s.get(name) == defaults[name], name
    assert s.get("MASTER_ADDR") is None and s.get("SOCKET_IFNAME") is None and s.get("DIST_CKPT_PATH") is None
    assert (s.get("NNODES"), s.get("NPUS_PER_NODE"), s.get("MASTER_PORT")) == ("16", "16", "29444")
    assert s.get("RAY_DASHBOARD_HOST") == "127.0.0.1"  # the dashboard stays on localhost unless asked
    assert s.get("HCCL_IF_BASE_PORT") == "64247"
    assert s.world_size == 256


def test_empty_environment_value_falls_back_to_default() -> None:
    s = load_settings({}, None, environ={"NNODES": ""})
    assert (s.get("NNODES"), s.where("NNODES")) == ("16", "default")


def test_none_flags_do_not_override(tmp_path: Path) -> None:
    s = load_settings({"NNODES": None}, write(tmp_path, "NNODES=3\n"), environ={})  # type: ignore[dict-item]
    assert s.get("NNODES") == "3"


def test_reads_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NNODES", "5")
    assert load_settings({}, None).get("NNODES") == "5"


# ---- env file ---------------------------------------------------------------------------------------


def test_env_file_syntax(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "\n".join(
            [
                "# cluster of the lab",
                "",
                "export MASTER_ADDR=10.1.2.3",
                "  SOCKET_IFNAME = 'enp189s0f0'   ",
                'DIST_CKPT_PATH="/data/ckpt dir/dsv3"  # trailing comment',
                "NNODES=2 # two nodes",
                "   # indented comment",
                "MODEL_PATH=",
            ]
        )
        + "\n",
    )
    values = read_env_file(f)
    assert values["MASTER_ADDR"] == ("10.1.2.3", 3)
    assert values["SOCKET_IFNAME"] == ("enp189s0f0", 4)
    assert values["DIST_CKPT_PATH"] == ("/data/ckpt dir/dsv3", 5)
    assert values["NNODES"] == ("2", 6)
    assert values["MODEL_PATH"] == ("", 8)
    assert set(values) == {"MASTER_ADDR", "SOCKET_IFNAME", "DIST_CKPT_PATH", "NNODES", "MODEL_PATH"}


def test_unknown_key_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    f = write(tmp_path, "MASTER_ADDR=10.0.0.1\n\nMASTR_PORT=1\n")
    with pytest.raises(SettingsError) as e:
        read_env_file(f)
    assert f"{f}:3" in str(e.value) and "MASTR_PORT" in str(e.value)
    with pytest.raises(SettingsError):  # and through load_settings
        load_settings({}, f, environ={})


@pytest.mark.parametrize("line", ["this is not an assignment", "=value", "1ABC=2", "MASTER_ADDR"])
def test_malformed_line_is_an_error_with_file_and_line(tmp_path: Path, line: str) -> None:
    f = write(tmp_path, f"NNODES=2\n{line}\n")
    with pytest.raises(SettingsError) as e:
        read_env_file(f)
    assert f"{f}:2" in str(e.value)


def test_unbalanced_quote_is_an_error_with_file_and_line(tmp_path: Path) -> None:
    f = write(tmp_path, "NNODES=2\nDIST_CKPT_PATH='/ckpt\n")
    with pytest.raises(SettingsError) as e:
        read_env_file(f)
    assert f"{f}:2" in str(e.value) and "DIST_CKPT_PATH" in str(e.value)


def test_missing_or_binary_env_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as e:
        read_env_file(tmp_path / "nope.env")
    assert "nope.env" in str(e.value)
    (tmp_path / "bin.env").write_bytes(b"NNODES=\xff\xfe\n")
    with pytest.raises(SettingsError) as e:
        read_env_file(tmp_path / "bin.env")
    assert "bin.env" in str(e.value) and "UTF-8" in str(e.value)


def test_pass_through_keys(tmp_path: Path) -> None:
    f = write(
        tmp_path,
        "HCCL_BUFFSIZE=400\nASCEND_GLOBAL_LOG_LEVEL=1\nVLLM_ASCEND_ENABLE_TOPK_OPTIMIZE=0\n"
        "RAY_DEDUP_LOGS=1\nPYTORCH_NPU_ALLOC_CONF=expandable_segments:False\n",
    )
    s = load_settings({}, f, environ={"HCCL_EXEC_TIMEOUT": "5"})
    assert s.get("HCCL_BUFFSIZE") == "400" and s.where("HCCL_BUFFSIZE") == f"{f}:1"
    assert s.get("ASCEND_GLOBAL_LOG_LEVEL") == "1"
    assert s.get("VLLM_ASCEND_ENABLE_TOPK_OPTIMIZE") == "0"
    assert s.get("RAY_DEDUP_LOGS") == "1"
    assert s.get("PYTORCH_NPU_ALLOC_CONF") == "expandable_segments:False"
    assert s.get("HCCL_EXEC_TIMEOUT") is None  # only the env file passes variables through, not the shell


# ---- validation -------------------------------------------------------------------------------------


def test_missing_master_addr_names_the_variable() -> None:
    s = load_settings({"SOCKET_IFNAME": "eth0"}, None, environ={})
    errors = validate_for_cluster(s, needs_checkpoint=False)
    assert len(errors) == 1
    assert errors[0].startswith("MASTER_ADDR is not set") and "--master-addr" in errors[0]


@pytest.mark.parametrize("placeholder", ["IP FOR MASTER NODE", "<master-ip>", "x.y.z.w:29444", "your_master_ip"])
def test_placeholder_master_addr_is_rejected(tmp_path: Path, placeholder: str) -> None:
    f = write(tmp_path, f'SOCKET_IFNAME=eth0\nMASTER_ADDR="{placeholder}"\n')
    s = load_settings({}, f, environ={})
    errors = validate_for_cluster(s, needs_checkpoint=False)
    assert len(errors) == 1, errors
    assert "MASTER_ADDR" in errors[0] and f"{f}:2" in errors[0] and "neither an IP address nor a host name" in errors[0]


@pytest.mark.parametrize("addr", ["10.0.0.1", "fe80::1", "head-node", "node01.cluster.local"])
def test_addresses_and_host_names_are_accepted(addr: str) -> None:
    assert validate_address("MASTER_ADDR", addr, "flag") == addr


@pytest.mark.parametrize(
    "value, words",
    [("0", "at least 1"), ("-3", "at least 1"), ("two", "expected an integer"), ("1.5", "expected an integer")],
)
def test_bad_node_count(value: str, words: str) -> None:
    s = load_settings({**GOOD, "NNODES": value}, None, environ={})
    errors = validate_for_cluster(s, needs_checkpoint=True)
    assert len(errors) == 1 and errors[0].startswith(
        f"NNODES={value!r}" if words.startswith("expected") else f"NNODES={int(value)}"
    )
    assert words in errors[0] and "(flag)" in errors[0]
    with pytest.raises(SettingsError):
        _ = s.world_size


def test_port_out_of_range() -> None:
    errors = validate_for_cluster(load_settings({**GOOD, "MASTER_PORT": "70000"}, None, environ={}), True)
    assert errors == ["MASTER_PORT=70000 (flag): not a port number"]


def test_validate_for_cluster_lists_every_problem(tmp_path: Path) -> None:
    f = write(tmp_path, "NNODES=0\nNODE_ROLE=boss\nRAY_DASHBOARD_PORT=http\n")
    s = load_settings({"HCCL_IF_BASE_PORT": "99999"}, f, environ={})
    errors = validate_for_cluster(s, needs_checkpoint=True)
    text = "\n".join(errors)
    for name in (
        "MASTER_ADDR",
        "NNODES",
        "RAY_DASHBOARD_PORT",
        "HCCL_IF_BASE_PORT",
        "SOCKET_IFNAME",
        "NODE_ROLE",
        "DIST_CKPT_PATH",
    ):
        assert sum(e.startswith(name) for e in errors) == 1, (name, text)
    assert len(errors) == 7
    assert f"{f}:1" in text and f"{f}:2" in text


def test_checkpoint_required_only_for_true_weight() -> None:
    s = load_settings({k: v for k, v in GOOD.items() if k != "DIST_CKPT_PATH"}, None, environ={})
    assert validate_for_cluster(s, needs_checkpoint=False) == []
    (err,) = validate_for_cluster(s, needs_checkpoint=True)
    assert err.startswith("DIST_CKPT_PATH is not set")


def test_a_complete_cluster_setting_validates() -> None:
    assert validate_for_cluster(load_settings(GOOD, None, environ={}), needs_checkpoint=True) == []


def test_describe_settings_lists_every_setting_with_default_or_required() -> None:
    text = describe_settings()
    for s in SETTINGS:
        (line,) = [ln for ln in text.splitlines() if ln.split() and ln.split()[0] == s.name]
        if s.default is not None:
            assert f"[default: {s.default}]" in line
    assert "[required]" in next(ln for ln in text.splitlines() if ln.split()[0] == "MASTER_ADDR")
