"""The cross-node collective check: two fake nodes (processes of this host, NODE_ROLE head and worker, SOCKET_IFNAME
lo) given the same token on stdin each start their ranks through the repo's multi-rank harness, join over gloo
through the head's store, and pass an all-reduce and an all-to-all; a node that never joins is named within
WAIT_TIMEOUT_S; a rogue process that joins the store without the token is refused by name before any rank
starts; forged, malformed and out-of-range reports are refused field by field; bad flags are one line."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.base.finite_float import float_arg
from verl_patches.base.free_port import free_port
from verl_patches.launch.cluster import collective_check
from verl_patches.launch.cluster.collective_check import (
    collect_reports,
    parse_args,
    read_token,
    registrations,
    serve_store,
)
from verl_patches.launch.cluster.collective_rank import all_to_all_problems, bus_bandwidth_gbs, expected_all_reduce
from verl_patches.launch.cluster.collective_report import (
    Expected,
    NodeInfo,
    NodeOutcome,
    RankResult,
    Refused,
    check_token,
    node_info,
    node_outcome,
    seal,
    start_message,
    summarize,
    unseal,
)
from verl_patches.launch.settings import SettingsError

ROOT = Path(__file__).resolve().parents[3]
TOKEN = b"0123456789abcdef" * 4
NONCE_HEX = "a" * 32

ROGUE = r"""
import json, sys, time
from datetime import timedelta
import torch.distributed as dist
port = int(sys.argv[1])
store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
index = store.add("collective_check/joined", 1)
forged = {"kind": "node", "index": index, "mac": "0" * 64,
          "body": json.dumps({"host": "rogue", "ip": "10.9.9.9", "nnodes": 2, "npus": 2, "backend": "gloo"})}
store.set(f"collective_check/node/{index}", json.dumps(forged))
rank = {"rank": 2, "host": "rogue", "device": "cpu", "backend": "hccl", "setup_s": 0.1, "bytes": 1 << 30,
        "all_reduce_s": 1e-9, "all_to_all_s": 1e-9}
report = {"kind": "report", "index": index, "mac": "0" * 64,
          "body": json.dumps({"ranks": [rank, {**rank, "rank": 3}]})}
store.set(f"collective_check/report/{index}", json.dumps(report))
time.sleep(20)
"""


def fake_cluster_env(tmp_path: Path, wait_s: int = 60) -> Path:
    env = tmp_path / "cluster.env"
    env.write_text(
        "MASTER_ADDR=127.0.0.1\nSOCKET_IFNAME=lo\nNNODES=2\nNPUS_PER_NODE=2\n"
        f"WAIT_TIMEOUT_S={wait_s}\nJEMALLOC_LIB=none\nLOG_DIR={tmp_path / 'logs'}\n"
    )
    return env


def start_node(env_file: Path, role: str, port: int, *extra: str, token: bytes = TOKEN) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "verl_patches.launch.cluster.collective_check", "--env-file", str(env_file)]
    cmd += ["--node-role", role, "--port", str(port), "--mib", "0.25", "--iters", "1", "--timeout-s", "150"]
    cmd += ["--token-stdin", *extra]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "NNODES", "NODE_ROLE")}
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    proc.stdin.write(token.decode() + "\n")  # the token on stdin: never in argv, where `ps` shows it to anyone
    proc.stdin.close()
    proc.stdin = None  # closed: communicate() has nothing to send
    return proc


@pytest.mark.slow  # six processes that each import torch: over 20 s on a shared 2-core machine
@pytest.mark.timeout(300)
def test_two_fake_nodes_pass_over_gloo(tmp_path):
    env_file, port = fake_cluster_env(tmp_path), free_port()
    head = start_node(env_file, "head", port)
    worker = start_node(env_file, "worker", port, "--mib", "4")  # the head's size is what every node times
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
    assert f"FAIL: only 1 of 2 nodes joined within WAIT_TIMEOUT_S=3 s (joined: {socket.gethostname()})" in out


@pytest.mark.timeout(200)
def test_a_node_with_other_settings_is_named_before_any_rank_starts(tmp_path):
    env_file, port = fake_cluster_env(tmp_path), free_port()
    head = start_node(env_file, "head", port)
    worker = start_node(env_file, "worker", port, "--npus-per-node", "1")
    worker_out, _ = worker.communicate(timeout=150)
    head_out, _ = head.communicate(timeout=150)
    assert head.returncode == 1 and worker.returncode == 1, head_out + worker_out
    assert "has NNODES=2 NPUS_PER_NODE=1, the head NNODES=2 NPUS_PER_NODE=2" in head_out
    assert "the head stopped the check: node 1" in worker_out
    assert "starting" not in head_out + worker_out


@pytest.mark.slow  # the head waits REGISTER_WAIT_S for a sealed join, then keeps its store up ABORT_GRACE_S
@pytest.mark.timeout(200)
def test_a_rogue_node_that_ran_no_rank_is_refused_by_name(tmp_path):
    """The attack: a process that reaches the head's port joins the count and writes a join and an "ok, 99 GB/s"
    report with the head's backend and size of its own choosing. Without the token its join is not sealed: the
    head names it and stops before any rank starts; nothing of its report is shown."""
    env_file, port = fake_cluster_env(tmp_path, wait_s=60), free_port()
    head = start_node(env_file, "head", port)
    rogue_script = tmp_path / "rogue.py"
    rogue_script.write_text(ROGUE)
    rogue = None
    for _ in range(100):  # once the head's store is up
        if head.poll() is not None:
            break
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            rogue = subprocess.Popen([sys.executable, str(rogue_script), str(port)], cwd=tmp_path)
            break
        except OSError:
            time.sleep(0.3)
    try:
        out, _ = head.communicate(timeout=150)
    finally:
        if rogue is not None:
            rogue.kill()
            rogue.wait()
    assert head.returncode == 1, out
    assert (
        "FAIL: join of node 1: not sealed with this check's token for this run (a process that was not started "
        "for this check, or a node given another token)"
    ) in out
    assert "ok;" not in out and "PASS" not in out and "rogue" not in out and "starting" not in out


def test_the_store_listens_on_the_head_address_only_and_a_busy_port_is_named():
    port = free_port()
    store = serve_store("127.0.0.1", port, 5.0)
    store.set("k", "v")
    listening = [ln.split()[1] for ln in Path("/proc/net/tcp").read_text().splitlines()[1:] if ln.split()[3] == "0A"]
    assert f"0100007F:{port:04X}" in listening and f"00000000:{port:04X}" not in listening
    with pytest.raises(SettingsError) as e:  # held by this test process: no collective_check
        serve_store("127.0.0.1", port, 5.0)
    assert str(e.value) == (
        f"cannot listen on 127.0.0.1:{port} (Address already in use): another process listens there (while the "
        "job runs, its Ray head holds MASTER_PORT); stop it, or choose a free port with --port"
    )
    del store


def test_a_port_held_by_a_check_process_is_told_apart(tmp_path):
    proc = tmp_path / "proc"
    (proc / "net").mkdir(parents=True)
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    row = "   0: 0100007F:{port:04X} 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"
    (proc / "net/tcp").write_text(header + row.format(port=29444, inode=555) + row.format(port=8265, inode=777))
    for pid, inode, cmd in (
        (101, 555, b"python3\0-m\0verl_patches.launch.cluster.collective_check\0"),
        (102, 777, b"ray\0"),
    ):
        (proc / str(pid) / "fd").mkdir(parents=True)
        (proc / str(pid) / "fd/3").symlink_to(f"socket:[{inode}]")
        (proc / str(pid) / "cmdline").write_bytes(cmd)
    assert collective_check.held_by_a_check(29444, proc) and not collective_check.held_by_a_check(8265, proc)
    assert not collective_check.held_by_a_check(1234, proc)


@pytest.mark.timeout(200)
def test_a_second_check_on_the_head_host_is_told_to_be_a_worker(tmp_path):
    """The CPU test's mistake (issue 42): two processes on one host both own MASTER_ADDR and so both take the
    head's role; the second is told to start with --node-role worker, not that the job's Ray head runs."""
    env_file, port = fake_cluster_env(tmp_path, wait_s=60), free_port()
    first = start_node(env_file, "auto", port)
    try:
        for _ in range(300):  # until the first one's store listens
            if first.poll() is not None or collective_check.listening_inodes(port):
                break
            time.sleep(0.2)
        second = start_node(env_file, "auto", port)
        out, _ = second.communicate(timeout=150)
    finally:
        first.kill()
        first.communicate()
    assert second.returncode == 2, out
    assert out.strip().splitlines()[-1] == (
        f"collective_check: cannot listen on 127.0.0.1:{port}: another collective_check on this host listens "
        "there; this host owns 127.0.0.1 (MASTER_ADDR), so a check started here is the head unless given "
        "--node-role worker: start this host's other node processes with --node-role worker, or stop that check"
    )


def test_wrong_values_name_the_sending_rank():
    assert expected_all_reduce(4) == 10
    assert all_to_all_problems(1, 3, [1.0, 4.0, 7.0]) == []
    assert all_to_all_problems(1, 3, [1.0, 5.0, 7.0]) == ["from rank 1: 5, expected 4"]
    assert bus_bandwidth_gbs(10**9, 1.0, 4, "all_reduce") == pytest.approx(1.5)
    assert bus_bandwidth_gbs(10**9, 1.0, 4, "all_to_all") == pytest.approx(0.75)


# --- flags and the token -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--mib", "nan", "expected a finite decimal number, got 'nan'"),
        ("--mib", "0", "must be above 0 and at most 65536, got 0"),
        ("--port", "-5", "must be at least 1, got -5"),
        ("--port", "0", "must be at least 1, got 0"),
        ("--port", "70000", "must be at most 65535, got 70000"),
        ("--timeout-s", "inf", "expected a finite decimal number, got 'inf'"),
        ("--timeout-s", "1e400", "expected a finite number, got inf"),
        ("--iters", "0", "must be at least 1, got 0"),
        ("--mib", "1_0", "expected a finite decimal number, got '1_0'"),
        ("--mib", "\u0661", "expected a finite decimal number, got '\u0661'"),
    ],
)
def test_bad_flags_are_refused_in_one_line(capsys, flag, value, message):
    with pytest.raises(SystemExit) as e:
        parse_args(["--env-file", "cluster.env", flag, value])
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and err[-1].endswith(f"error: argument {flag}: {message}"), err
    assert len(err) == 2 and err[0].startswith("usage: ")  # argparse's one usage line, then the refusal


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=30))
def test_a_number_flag_is_finite_and_in_range_or_refused(text):
    try:
        value = float_arg(0, 65536)(text)
    except argparse.ArgumentTypeError as e:
        assert "\n" not in str(e)
        return
    assert math.isfinite(value) and 0 < value <= 65536


def test_help_documents_the_role_and_the_token(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = "".join(capsys.readouterr().out.split())  # argparse wraps lines, also after a hyphen
    assert "--node-roleNODE_ROLEhead|worker|auto(headwhenthisnodeownsMASTER_ADDR)" in text
    assert "givethesecond--node-roleworker" in text and "--token-stdin" in text


def test_the_token_comes_from_stdin_or_the_environment_never_argv():
    assert read_token(True, 2, io.StringIO(TOKEN.decode() + "\n"), {}) == TOKEN
    assert read_token(False, 2, io.StringIO(), {"VERL_PATCHES_CHECK_TOKEN": TOKEN.decode()}) == TOKEN
    assert len(read_token(False, 1, io.StringIO(), {})) == 64  # one node: a random one, nothing to prove
    with pytest.raises(SettingsError, match=r"^NNODES=2 and no token: .* --token-stdin"):
        read_token(False, 2, io.StringIO(), {})
    with pytest.raises(SettingsError, match=r"^--token-stdin: the check's token must be 32 to 512 .* \(got 5 "):
        read_token(True, 2, io.StringIO("short\n"), {})
    with pytest.raises(SettingsError, match="got 0 characters"):
        read_token(True, 2, io.StringIO(""), {})
    with pytest.raises(Refused, match="without spaces"):
        check_token("a b" * 20, "VERL_PATCHES_CHECK_TOKEN")


def test_no_token_with_two_nodes_stops_before_anything_starts(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("VERL_PATCHES_CHECK_TOKEN", raising=False)
    for name in ("MASTER_ADDR", "NNODES", "NODE_ROLE"):
        monkeypatch.delenv(name, raising=False)
    assert collective_check.main(["--env-file", str(fake_cluster_env(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith("collective_check: NNODES=2 and no token") and err.count("\n") == 1


# --- sealed messages and reports, read as hostile data ----------------------------------------------------


def _rank(r: int, t: float = 0.01, **over) -> dict:
    return {
        "rank": r,
        "host": "h",
        "device": "cpu",
        "backend": "gloo",
        "setup_s": 1.0,
        "bytes": 1 << 20,
        "all_reduce_s": t,
        "all_to_all_s": t,
        **over,
    }


INFO = NodeInfo("b", "10.0.0.2", 2, 2, "gloo")
EXPECT = Expected(first_rank=2, npus=2, world=4, backend="gloo", timed_bytes=1 << 20, timeout_s=150.0)


def test_a_sealed_message_opens_only_with_the_token_nonce_kind_and_node_it_was_sealed_for():
    raw = seal(TOKEN, NONCE_HEX, "report", 1, {"ranks": []})
    assert unseal(TOKEN, NONCE_HEX, "report", 1, raw) == {"ranks": []}
    for token, nonce, kind, index, match in [
        (b"x" * 64, NONCE_HEX, "report", 1, "not sealed with this check's token"),
        (TOKEN, "b" * 32, "report", 1, "not sealed with this check's token"),  # an earlier run's: no replay
        (TOKEN, NONCE_HEX, "node", 1, "sealed for another message or node"),
        (TOKEN, NONCE_HEX, "report", 2, "sealed for another message or node"),
    ]:
        with pytest.raises(Refused, match=match):
            unseal(token, nonce, kind, index, raw)
    env = json.loads(raw)
    env["body"] = json.dumps({"ranks": [_rank(2)]})  # a report changed after it was sealed
    with pytest.raises(Refused, match="not sealed with this check's token"):
        unseal(TOKEN, NONCE_HEX, "report", 1, json.dumps(env).encode())


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=20) | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=5),
    max_leaves=20,
)
RANK_LIKE = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=5) | st.integers(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(sorted(_rank(0))), inner, max_size=8),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=300), JSON_VALUES.map(lambda v: json.dumps(v).encode())))
def test_anything_in_the_store_is_refused_or_read_never_a_crash(raw):
    for kind in ("node", "report", "start"):
        try:
            body = unseal(TOKEN, NONCE_HEX, kind, 1, raw)
        except Refused:
            continue
        pytest.fail(f"an unsealed message was accepted: {body}")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["ranks", "error", "failed_local_ranks", "x"]), RANK_LIKE))
def test_a_sealed_report_of_any_shape_is_refused_or_checked_never_a_crash(body):
    try:
        outcome = node_outcome(body, INFO, EXPECT, "report of node 1")
    except Refused:
        return
    assert outcome.error or len(outcome.ranks) == 2


@pytest.mark.parametrize(
    "ranks,match",
    [
        ([_rank(2, backend="hccl"), _rank(3)], "rank 2 ran hccl, the head asked for gloo"),
        ([_rank(2, bytes=1 << 30), _rank(3)], "rank 2 timed 1073741824 bytes, the head asked for 1048576"),
        ([_rank(2), _rank(2)], "ranks must be 2-3, each once"),
        ([_rank(0), _rank(3)], "rank must be an integer in 2..3, got 0"),
        ([_rank(2, rank=True), _rank(3)], "rank must be an integer in 2..3, got True"),
        ([_rank(2)], "ranks must list the results of its 2 ranks"),
        ([_rank(2, all_reduce_s=0), _rank(3)], "all_reduce_s must be a finite number of seconds in 0..150"),
        ([_rank(2, setup_s=-1.0), _rank(3)], "setup_s must be a finite number"),
        ([_rank(2, all_to_all_s=10**400), _rank(3)], "all_to_all_s must be a finite number"),
        ([_rank(2, all_to_all_s="0.1"), _rank(3)], "all_to_all_s must be a finite number"),
        ([_rank(2, host="a\x1b[2Jb"), _rank(3)], "host must be printable text"),
        ([{**_rank(2), "all_reduce_busbw_gbs": 99.0}, _rank(3)], "must have exactly the keys"),
        ([_rank(2), "x"], "must have exactly the keys"),
    ],
)
def test_every_field_of_a_report_is_checked_against_what_the_head_asked(ranks, match):
    with pytest.raises(Refused, match=match):
        node_outcome({"ranks": ranks}, INFO, EXPECT, "report of node 1")


def test_a_report_in_json_with_nan_is_refused():
    raw = seal(TOKEN, NONCE_HEX, "report", 1, {"ranks": []}).replace(b'{\\"ranks\\":[]}', b'{\\"x\\":NaN}')
    with pytest.raises(Refused):
        unseal(TOKEN, NONCE_HEX, "report", 1, raw)


def test_joins_and_start_messages_are_checked():
    assert node_info(INFO.body(), "join") == INFO
    for bad, match in [
        ({**INFO.body(), "ip": "10.0.0.2; rm"}, "ip must be an IPv4 address"),
        ({**INFO.body(), "npus": 1.5}, "npus must be an integer"),
        ({**INFO.body(), "backend": "mpi"}, "backend must be one of hccl, gloo, nccl"),
        ({"host": "b"}, "expected the keys"),
    ]:
        with pytest.raises(Refused, match=match):
            node_info(bad, "join")
    assert start_message({"abort": "stop\x1b[2J"}) == "stop\\x1b[2J"
    assert start_message({"go": {"nbytes": 8, "iters": 1, "timeout_s": 5}}).nbytes == 8
    with pytest.raises(Refused, match="timeout_s must be a finite number"):
        start_message({"go": {"nbytes": 8, "iters": 1, "timeout_s": 0}})


class ScriptedStore:
    """A store whose keys change between reads as listed: a forged value, then the node's own."""

    def __init__(self, values: dict[str, list[bytes]]) -> None:
        self.values = values

    def check(self, keys: list[str]) -> bool:
        return all(self.values.get(k) for k in keys)

    def get(self, key: str) -> bytes:
        values = self.values[key]
        return values.pop(0) if len(values) > 1 else values[0]


def test_a_forged_report_is_waited_past_and_a_node_with_only_forgeries_is_named():
    own = seal(TOKEN, NONCE_HEX, "report", 1, {"ranks": [_rank(2), _rank(3)]})
    forged = seal(b"y" * 64, NONCE_HEX, "report", 1, {"ranks": [_rank(2), _rank(3)]})
    store = ScriptedStore({"collective_check/report/1": [forged, forged, own]})
    outcomes = collect_reports(store, TOKEN, NONCE_HEX, {1: INFO}, lambda i: EXPECT, deadline=1e18)
    assert [r.rank for r in outcomes[1].ranks] == [2, 3]
    store = ScriptedStore({"collective_check/report/1": [forged]})
    outcomes = collect_reports(store, TOKEN, NONCE_HEX, {1: INFO}, lambda i: EXPECT, time.monotonic() + 0.5)
    assert outcomes[1].error.startswith("its report was refused: report of node 1: not sealed with")


def test_a_counted_node_without_a_sealed_join_stops_the_check_by_name():
    head = NodeInfo("a", "10.0.0.1", 3, 2, "gloo")
    store = ScriptedStore(
        {
            "collective_check/node/1": [seal(TOKEN, NONCE_HEX, "node", 1, INFO.body() | {"nnodes": 3})],
            "collective_check/node/2": [seal(b"z" * 64, NONCE_HEX, "node", 2, INFO.body())],
        }
    )
    _, problem = registrations(store, TOKEN, NONCE_HEX, head, 0.5)
    assert problem.startswith("join of node 2: not sealed with this check's token")
    store.values["collective_check/node/2"] = []  # counted, never wrote its join
    _, problem = registrations(store, TOKEN, NONCE_HEX, head, 0.5)
    assert problem == "node 2 was counted as joined but never sent its join (not a check process of this run?)"
    hccl = INFO.body() | {"nnodes": 3, "backend": "hccl"}
    store.values["collective_check/node/2"] = [seal(TOKEN, NONCE_HEX, "node", 2, hccl)]
    infos, problem = registrations(store, TOKEN, NONCE_HEX, head, 0.5)
    assert problem == "node 2 b (10.0.0.2) would run hccl, the head gloo" and sorted(infos) == [1, 2]


def test_the_summary_names_failed_missing_and_slow_nodes_and_shows_what_the_head_asked():
    def node(host: str, ip: str, *times: float) -> NodeOutcome:
        return NodeOutcome(host, ip, tuple(RankResult(i, host, "cpu", 1.0, t, t) for i, t in enumerate(times)))

    outcomes = {
        0: node("a", "10.0.0.1", 0.01, 0.01),
        1: node("b", "10.0.0.2", 0.01, 0.01),
        2: node("c", "10.0.0.3", 0.05, 0.01),
        3: NodeOutcome("d", "10.0.0.4", error="1 of 2 ranks failed: local rank 1 raised (AssertionError)"),
    }
    ok, lines = summarize(outcomes, 5, 2, "hccl", 1 << 20)
    assert not ok
    bw = bus_bandwidth_gbs(1 << 20, 0.01, 10, "all_reduce")  # computed here, from the verified time
    assert lines[0].startswith(f"node 0 a (10.0.0.1): ranks 0-1: ok; set-up 1.0 s; all_reduce {bw:.2f}-{bw:.2f}")
    assert lines[2].startswith("node 2 c (10.0.0.3): ranks 4-5: SLOW") and "5.0x the median" in lines[2]
    assert lines[3] == "node 3 d (10.0.0.4): ranks 6-7: FAIL: 1 of 2 ranks failed: local rank 1 raised (AssertionError)"
    assert lines[4].startswith("node 4: ranks 8-9: FAIL: no report")
    assert lines[-1] == "FAIL (10 ranks on 5 nodes, hccl, 1 MiB per rank); failed: node 3 d (10.0.0.4), node 4"
