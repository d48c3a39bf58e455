"""Attacks on the launcher (issue 18): shell text built from setting values, and a dashboard opened to
the network without anyone asking."""

from __future__ import annotations

import pytest

from verl_patches.base import node_ip
from verl_patches.launch import job
from verl_patches.launch.settings import dashboard_exposure, load_settings, validate_for_cluster

GOOD = {"MASTER_ADDR": "10.0.0.1", "SOCKET_IFNAME": "eth0", "NNODES": "2", "NPUS_PER_NODE": "16"}


@pytest.mark.parametrize("dirname", ['a$(touch {m})b', 'q"; touch {m}; echo "', "b`touch {m}`", "-x"])
def test_cann_script_paths_are_file_names_never_shell_text(tmp_path, monkeypatch, dirname):
    marker = tmp_path / "pwned"
    folder = tmp_path / dirname.format(m=marker).replace("/", "_")
    folder.mkdir()
    script = folder / "set_env.sh"
    script.write_text("export ASCEND_TOOLKIT_HOME=/opt/cann\nexport LD_LIBRARY_PATH=/opt/cann/lib\n")
    monkeypatch.chdir(tmp_path)
    env = job.source_scripts([str(script.relative_to(tmp_path))])
    assert env["ASCEND_TOOLKIT_HOME"] == "/opt/cann"
    assert not marker.exists()


def test_sourcing_two_scripts_keeps_both_and_a_missing_one_is_skipped(tmp_path):
    a, b = tmp_path / "a.sh", tmp_path / "b.sh"
    a.write_text("export A_VAR=1\n")
    b.write_text("export B_VAR=2\n")
    env = job.source_scripts([str(a), str(tmp_path / "absent.sh"), str(b)])
    assert env["A_VAR"] == "1" and env["B_VAR"] == "2"


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "::"])
def test_non_loopback_dashboard_needs_the_explicit_flag(host):
    s = load_settings({**GOOD, "RAY_DASHBOARD_HOST": host}, None, environ={})
    (err,) = validate_for_cluster(s, needs_checkpoint=False)
    assert f"RAY_DASHBOARD_HOST={host} (flag)" in err and "--allow-remote-dashboard" in err
    assert validate_for_cluster(s, needs_checkpoint=False, allow_remote_dashboard=True) == []
    warning = dashboard_exposure(s, allow_remote=True)
    assert warning.startswith("WARNING:") and "firewall" in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", None])
def test_loopback_dashboard_needs_nothing(host):
    s = load_settings({**GOOD, **({"RAY_DASHBOARD_HOST": host} if host else {})}, None, environ={})
    assert validate_for_cluster(s, needs_checkpoint=False) == []
    assert dashboard_exposure(s, allow_remote=False) is None


def test_dashboard_host_from_the_environment_is_checked_too():
    s = load_settings(GOOD, None, environ={"RAY_DASHBOARD_HOST": "0.0.0.0"})
    (err,) = validate_for_cluster(s, needs_checkpoint=False)
    assert "(environment)" in err
    s = load_settings(GOOD, None, environ={"RAY_DASHBOARD_HOST": "$(reboot)"})
    (err,) = validate_for_cluster(s, needs_checkpoint=False)
    assert "expected an IP address" in err


def test_launch_refuses_an_open_dashboard_before_touching_the_network(monkeypatch, capsys):
    def must_not_be_reached(*a, **k):
        raise AssertionError("the launch went on past the settings check")

    monkeypatch.setattr(node_ip, "interface_ipv4", must_not_be_reached)
    rc = job.main(
        [
            "--profile",
            "a3_256die_random_init",
            "--master-addr",
            "10.0.0.1",
            "--socket-ifname",
            "eth0",
            "--ray-dashboard-host",
            "0.0.0.0",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "RAY_DASHBOARD_HOST=0.0.0.0" in err and "--allow-remote-dashboard" in err
