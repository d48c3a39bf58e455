"""The cross-node collective check: two fake nodes (processes of this host, NODE_ROLE head and worker, SOCKET_IFNAME
lo) each start their ranks through the repo's multi-rank harness, join over gloo through the head's store, and
pass an all-reduce and an all-to-all; a node that never joins is named within WAIT_TIMEOUT_S; wrong values,
failed nodes and a slow node are named in the head's summary."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.base.free_port import free_port
from verl_patches.launch.collective_check import serve_store, summarize
from verl_patches.launch.collective_rank import all_to_all_problems, bus_bandwidth_gbs, expected_all_reduce
from verl_patches.launch.settings import SettingsError

ROOT = Path(__file__).resolve().parents[2]


def fake_cluster_env(tmp_path: Path, wait_s: int = 60) -> Path:
    env = tmp_path / "cluster.env"
    env.write_text(
        "MASTER_ADDR=127.0.0.1\nSOCKET_IFNAME=lo\nNNODES=2\nNPUS_PER_NODE=2\n"
        f"WAIT_TIMEOUT_S={wait_s}\nJEMALLOC_LIB=none\nLOG_DIR={tmp_path / 'logs'}\n"
    )
    return env


def start_node(env_file: Path, role: str, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "verl_patches.launch.collective_check", "--env-file", str(env_file)]
    cmd += ["--node-role", role, "--port", str(port), "--mib", "0.25", "--iters", "1", "--timeout-s", "150", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NNODES", "NODE_ROLE")}
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow  # six processes that each import torch: over 20 s on a shared 2-core machine
@pytest.mark.timeout(300)
def test_two_fake_nodes_pass_over_gloo(tmp_path):
    env_file, port = fake_cluster_env(tmp_path), free_port()
    head = start_node(env_file, "head", port)
    worker = start_node(env_file, "worker", port)
    worker_out, _ = worker.communicate(timeout=280)
    head_out, _ = head.communicate(timeout=280)
    assert head.returncode == 0, head_out + worker_out
    assert worker.returncode == 0, worker_out
    assert "PASS (4 ranks on 2 nodes, gloo, 0.25 MiB per rank)" in head_out
    assert "node 0 " in head_out and "ranks 0-1: ok" in head_out and "ranks 2-3: ok" in head_out
    assert "GB/s bus" in head_out
    assert "this node's ranks passed" in worker_out


@pytest.mark.timeout(120)
def test_a_node_that_never_joins_is_reported_within_the_wait(tmp_path):
    head = start_node(fake_cluster_env(tmp_path, wait_s=3), "head", free_port())
    out, _ = head.communicate(timeout=100)
    assert head.returncode == 1, out
    assert f"only 1 of 2 nodes joined within WAIT_TIMEOUT_S=3 s (joined: {socket.gethostname()})" in out


@pytest.mark.timeout(200)
def test_a_node_with_other_settings_is_named_before_any_rank_starts(tmp_path):
    env_file, port = fake_cluster_env(tmp_path), free_port()
    head = start_node(env_file, "head", port)
    worker = start_node(env_file, "worker", port, "--npus-per-node", "1")
    worker_out, _ = worker.communicate(timeout=150)
    head_out, _ = head.communicate(timeout=150)
    assert head.returncode == 1 and worker.returncode == 1, head_out + worker_out
    assert "has NNODES=2 NPUS_PER_NODE=1, the head NNODES=2 NPUS_PER_NODE=2" in head_out
    assert "the head stopped the check: abort: node 1" in worker_out
    assert "starting" not in head_out + worker_out


def test_the_store_listens_on_the_head_address_only_and_a_busy_port_is_named():
    port = free_port()
    store = serve_store("127.0.0.1", port, 5.0)
    store.set("k", "v")
    listening = [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:] if ln.split()[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening and f"00000000:{port:04X}" not in listening
    with pytest.raises(SettingsError, match=f"cannot listen on 127.0.0.1:{port}.*pass --port"):
        serve_store("127.0.0.1", port, 5.0)
    del store


def test_wrong_values_name_the_sending_rank():
    assert expected_all_reduce(4) == 10
    assert all_to_all_problems(1, 3, [1.0, 4.0, 7.0]) == []
    assert all_to_all_problems(1, 3, [1.0, 5.0, 7.0]) == ["from rank 1: 5, expected 4"]
    assert bus_bandwidth_gbs(10**9, 1.0, 4, "all_reduce") == pytest.approx(1.5)
    assert bus_bandwidth_gbs(10**9, 1.0, 4, "all_to_all") == pytest.approx(0.75)


def _rank(r: int, t: float) -> dict:
    return {
        "rank": r,
        "setup_s": 1.0,
        "bytes": 1 << 20,
        "backend": "hccl",
        "all_reduce_s": t,
        "all_to_all_s": t,
        "all_reduce_busbw_gbs": 10.0,
        "all_to_all_busbw_gbs": 5.0,
    }


def test_the_summary_names_failed_missing_and_slow_nodes():
    reports = {
        0: {"host": "a", "ip": "10.0.0.1", "ranks": [_rank(0, 0.01), _rank(1, 0.01)]},
        1: {"host": "b", "ip": "10.0.0.2", "ranks": [_rank(2, 0.01), _rank(3, 0.01)]},
        2: {"host": "c", "ip": "10.0.0.3", "ranks": [_rank(4, 0.05), _rank(5, 0.01)]},
        3: {"host": "d", "ip": "10.0.0.4", "error": "1 of 2 ranks failed: local rank 1 raised (AssertionError)"},
    }
    ok, lines = summarize(reports, 5, 2)
    assert not ok
    assert lines[0].startswith("node 0 a (10.0.0.1): ranks 0-1: ok; set-up 1.0 s")
    assert lines[2].startswith("node 2 c (10.0.0.3): ranks 4-5: SLOW") and "5.0x the median" in lines[2]
    assert lines[3] == "node 3 d (10.0.0.4): ranks 6-7: FAIL: 1 of 2 ranks failed: local rank 1 raised (AssertionError)"
    assert lines[4].startswith("node 4: ranks 8-9: FAIL: no report")
    assert lines[-1] == "FAIL (10 ranks on 5 nodes, hccl, 1 MiB per rank); failed: node 3 d (10.0.0.4), node 4"
