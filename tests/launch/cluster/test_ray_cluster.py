"""Ray bring-up owns exactly what it starts (vendor item K1's `pkill -9 python` / `ray stop --force`
defects): a head waits for the NPUs with progress lines and a timeout naming what is missing, and stopping
it ends its own process session and nothing else. The real-Ray test is marked slow; it never runs
`ray stop`. Each Ray started here lives in its own RAY_TMPDIR on free ports, so other Ray instances on
this machine are not touched."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest

from verl_patches.base.free_port import free_port
from verl_patches.launch import job
from verl_patches.launch.cluster.ray_cluster import (
    RayClusterError,
    RayNode,
    forget_current_cluster,
    group_members,
    head_command,
    start_node,
    wait_for_resource,
    worker_command,
)
from verl_patches.process_identity import signal_if_same


def group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.fixture
def bystander():
    """A process this launch did not start; it must survive every stop()."""
    p = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield p
    p.terminate()
    p.wait(10)


# ---- commands ----------------------------------------------------------------------------------------


def test_head_command() -> None:
    cmd = head_command("10.0.0.1", 29444, 16, "NPU", "127.0.0.1", 8260, num_cpus=8)
    assert cmd[:3] == [sys.executable, "-m", "ray.scripts.scripts"]
    assert cmd[3:6] == ["start", "--head", "--block"]  # foreground: its session is ours to stop
    assert "--node-ip-address=10.0.0.1" in cmd and "--port=29444" in cmd
    assert "--dashboard-host=127.0.0.1" in cmd and "--dashboard-port=8260" in cmd
    (res,) = [a for a in cmd if a.startswith("--resources=")]
    assert json.loads(res.split("=", 1)[1]) == {"NPU": 16}
    assert "--num-gpus=0" in cmd and "--num-cpus=8" in cmd and "stop" not in cmd


def test_worker_command() -> None:
    cmd = worker_command("10.0.0.1:29444", "10.0.0.2", 16, "NPU")
    assert cmd[3:5] == ["start", "--block"] and "--head" not in cmd
    assert "--address=10.0.0.1:29444" in cmd and "--node-ip-address=10.0.0.2" in cmd
    assert not any(a.startswith("--num-cpus") for a in cmd)


# ---- the address record of `ray start --head` ------------------------------------------------------


def test_forget_current_cluster_removes_only_our_record(tmp_path: Path) -> None:
    marker = tmp_path / "ray_current_cluster"
    marker.write_text("10.0.0.9:6379")
    forget_current_cluster("10.0.0.1:29444", marker)
    assert marker.read_text() == "10.0.0.9:6379"  # someone else's cluster: kept
    marker.write_text("10.0.0.1:29444\n")
    forget_current_cluster("10.0.0.1:29444", marker)
    assert not marker.exists()
    forget_current_cluster("10.0.0.1:29444", marker)  # already gone: no error


def test_forget_current_cluster_knows_how_ray_records_a_loopback_head(tmp_path: Path) -> None:
    from ray._private.services import resolve_ip_for_localhost

    marker = tmp_path / "ray_current_cluster"
    marker.write_text(f"{resolve_ip_for_localhost('127.0.0.1')}:4321")
    forget_current_cluster("127.0.0.1:4321", marker)
    assert not marker.exists()


def test_record_location_follows_ray_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    marker = tmp_path / "ray" / "ray_current_cluster"
    marker.parent.mkdir()
    marker.write_text("10.0.0.1:29444")
    forget_current_cluster("10.0.0.1:29444")
    assert not marker.exists()


# ---- stop() on plain process sessions (fast, no Ray) -----------------------------------------------


_SESSIONS: list[int] = []


@pytest.fixture(autouse=True)
def _no_session_outlives_its_test():
    """A test that fails before its stop() would leave its session looping: end what is left of it."""
    yield
    while _SESSIONS:
        for member in group_members(_SESSIONS.pop()):  # only processes this test started
            signal_if_same(member.pid, member.started, signal.SIGKILL)


def _session(tmp_path: Path, script: str) -> RayNode:
    node = start_node(["bash", "-c", script], "worker", tmp_path / "node.log")
    _SESSIONS.append(node.pid)
    time.sleep(0.5)  # let the children start
    return node


def test_stop_ends_the_whole_session_and_nothing_else(tmp_path: Path, bystander) -> None:
    node = _session(tmp_path, "sleep 300 & sleep 300 & wait")
    assert node.alive()
    pgid = os.getpgid(node.pid)
    assert pgid == node.pid  # its own session
    node.stop(grace_s=5)
    assert group_gone(pgid) and not node.alive()
    assert bystander.poll() is None


def test_stop_escalates_when_the_session_ignores_sigterm(tmp_path: Path, bystander) -> None:
    node = _session(tmp_path, "trap '' TERM; (trap '' TERM; sleep 300) & while true; do sleep 0.1; done")
    assert node.alive()
    pgid = node.pid
    t0 = time.time()
    node.stop(grace_s=1)
    assert group_gone(pgid) and not node.alive()
    assert time.time() - t0 < 10
    assert bystander.poll() is None


def test_a_helper_that_outlives_its_graceful_leader_gets_a_short_grace(tmp_path: Path, bystander) -> None:
    # Ray's runtime env agent at times ignores SIGTERM for over 20 s after `ray start --block` has stopped
    # everything it tracks (seen in CI): the leader's own drain keeps the full grace, the leftover helper
    # does not hold the stop for it.
    node = _session(tmp_path, "(trap '' TERM; sleep 300) & trap 'exit 1' TERM; while true; do sleep 0.1; done")
    pgid = node.pid
    t0 = time.time()
    node.stop(grace_s=20, leftover_grace_s=1)
    assert group_gone(pgid) and not node.alive()
    assert node.process.returncode == 1  # the leader ran its own SIGTERM handler: it was not killed
    assert time.time() - t0 < 8
    assert bystander.poll() is None


def test_stop_sweeps_children_left_behind_by_a_dead_leader(tmp_path: Path, bystander) -> None:
    node = _session(tmp_path, "(trap '' HUP; sleep 300) & exit 0")
    node.process.wait(5)
    pgid = node.pid
    assert not group_gone(pgid)  # the orphaned child still runs in our session
    node.stop(grace_s=2)
    assert group_gone(pgid)
    assert bystander.poll() is None


# ---- a real Ray head ----------------------------------------------------------------------------------


def _ray_has_token_auth() -> bool:
    """Token authentication came after Ray 2.46 (requirements.txt's pin), which has neither the mode nor the helper."""
    import importlib.util

    return importlib.util.find_spec("ray._private.authentication") is not None


def _refresh_ray_auth_cache() -> None:
    if not _ray_has_token_auth():
        return
    from ray._raylet import Config

    Config.initialize("")


@pytest.fixture
def ray_env(monkeypatch: pytest.MonkeyPatch):
    # A short private temp dir: Ray's unix socket paths must stay under 108 bytes.
    tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    monkeypatch.setenv("RAY_TMPDIR", tmp)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")  # the head's and this client's environment
    auth = job.ray_auth_env()
    assert auth == ({"RAY_AUTH_MODE": "token"} if _ray_has_token_auth() else {})
    job.use_ray_auth_here(auth)  # what the launcher does for its own client (Ray imported earlier here)
    yield Path(tmp)
    monkeypatch.undo()
    _refresh_ray_auth_cache()  # back to this process's own mode for later tests
    shutil.rmtree(tmp, ignore_errors=True)


def test_ray_auth_env_is_empty_on_a_ray_without_token_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    """On requirements.txt's Ray the launcher passes no auth variable to nodes or clients, whatever the
    environment says, and giving this process the (empty) mode changes nothing."""
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    before = dict(os.environ)
    auth = job.ray_auth_env()
    if _ray_has_token_auth():
        assert auth == {"RAY_AUTH_MODE": "token"}
        return
    assert auth == {}
    job.use_ray_auth_here(auth)
    assert dict(os.environ) == before


def test_use_ray_auth_here_reaches_a_ray_imported_before(monkeypatch: pytest.MonkeyPatch) -> None:
    if not _ray_has_token_auth():  # the newer-Ray branch of the launcher, exercised with a stand-in helper
        calls: list[str] = []
        fake = types.ModuleType("ray._private.authentication.authentication_token_setup")
        fake._enable_token_auth = lambda: calls.append(os.environ.get("RAY_AUTH_MODE", ""))
        monkeypatch.setitem(sys.modules, "ray._private.authentication", types.ModuleType("ray._private.authentication"))
        monkeypatch.setitem(sys.modules, fake.__name__, fake)
        monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
        assert job.ray_auth_env() == {"RAY_AUTH_MODE": "token"}
        job.use_ray_auth_here({"RAY_AUTH_MODE": "token"})
        assert calls == ["token"]
        return
    from ray._raylet import AuthenticationMode, get_authentication_mode

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    _refresh_ray_auth_cache()
    try:
        assert get_authentication_mode() != AuthenticationMode.TOKEN
        monkeypatch.setenv("RAY_AUTH_MODE", "token")
        assert get_authentication_mode() != AuthenticationMode.TOKEN  # the variable alone is not seen
        job.use_ray_auth_here({"RAY_AUTH_MODE": "token"})
        assert get_authentication_mode() == AuthenticationMode.TOKEN
    finally:
        monkeypatch.undo()
        _refresh_ray_auth_cache()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_real_head_waits_for_npus_and_stops_only_its_session(ray_env: Path, bystander) -> None:
    port = free_port()
    cmd = head_command("127.0.0.1", port, 2, "NPU", "127.0.0.1", free_port(), num_cpus=1)
    # Ports Ray would otherwise take at fixed defaults, so that a Ray of another user here cannot clash.
    cmd += [f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}"]
    env = dict(os.environ)
    assert env["RAY_AUTH_MODE"] == "token" and env["RAY_TMPDIR"] == str(ray_env)
    address = f"127.0.0.1:{port}"
    head = start_node(cmd, "head", ray_env / "logs" / "ray.log", env, address=address)
    pgid = head.pid
    try:
        lines: list[str] = []
        wait_for_resource(address, "NPU", 2, 1, timeout_s=90, head=head, progress=lines.append, poll_s=0.5)
        assert lines and lines[-1].startswith("waiting for NPUs: 2/2 on 1/1 nodes")
        assert all(ln.startswith("waiting for NPUs: ") for ln in lines)
        marker = ray_env / "ray" / "ray_current_cluster"
        assert marker.read_text().strip().endswith(f":{port}")  # the head recorded itself here

        # More NPUs than the cluster has: a timeout that says how many are missing.
        with pytest.raises(RayClusterError) as e:
            wait_for_resource(address, "NPU", 4, 2, timeout_s=1, head=head, progress=lambda _l: None, poll_s=0.3)
        assert "only 2 of 4 NPUs joined" in str(e.value) and "1/2 nodes" in str(e.value)
        assert "WAIT_TIMEOUT_S" in str(e.value)
    finally:
        t0 = time.time()
        head.stop(grace_s=20)
        stop_s = time.time() - t0
    assert group_gone(pgid), "a process of the Ray session survived stop()"
    assert not head.alive()
    assert not marker.exists()  # our record is gone, so the next ray.init() does not join a dead cluster
    assert bystander.poll() is None  # not ours: untouched
    assert stop_s < 15, f"stop took {stop_s:.0f} s: the head did not shut down gracefully"


@pytest.mark.timeout(60)
def test_wait_raises_when_the_head_dies(ray_env: Path) -> None:
    port = free_port()
    cmd = head_command("127.0.0.1", port, 2, "NPU", "127.0.0.1", free_port(), num_cpus=1) + ["--no-such-flag"]
    head = start_node(cmd, "head", ray_env / "ray.log", dict(os.environ), address=f"127.0.0.1:{port}")
    t0 = time.time()
    try:
        with pytest.raises(RayClusterError) as e:
            wait_for_resource(
                f"127.0.0.1:{port}", "NPU", 2, 1, timeout_s=40, head=head, progress=lambda _l: None, poll_s=0.5
            )
        assert "the Ray head exited" in str(e.value) and str(ray_env / "ray.log") in str(e.value)
        assert time.time() - t0 < 30  # noticed at the next poll, not after a connection timeout
    finally:
        head.stop(grace_s=5)
    assert group_gone(head.pid)


@pytest.mark.timeout(30)
def test_wait_times_out_promptly_when_nothing_listens() -> None:
    lines: list[str] = []
    t0 = time.time()
    with pytest.raises(RayClusterError) as e:
        wait_for_resource(f"127.0.0.1:{free_port()}", "NPU", 32, 2, timeout_s=1, progress=lines.append, poll_s=0.2)
    assert time.time() - t0 < 10
    assert "only 0 of 32 NPUs joined within 1 s (0/2 nodes)" in str(e.value)
    assert len(lines) == 1  # one line per change, not one per poll
    assert lines[0].startswith("waiting for NPUs: 0/32 on 0/2 nodes (") and lines[0].endswith(" s of 1 s)")
