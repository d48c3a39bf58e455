"""gather_logs: every node's run folders, Ray worker logs, HCCL flight-recorder dumps and CANN logs of one run in
``<out>/<node>/``. Fake nodes are folders (each a node's filesystem root) reached through a fake remote shell
that runs the real node side (`node_logs`) under that root; one node is dead, one sends a hostile stream."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from verl_patches.launch.gather_logs import member_parts

ROOT = Path(__file__).resolve().parents[2]
HEAD_RUN = "a3_256die_true_weight-20250701-134002-head-node-a"
START = time.mktime(time.strptime("20250701-134002", "%Y%m%d-%H%M%S"))

FAKE_SSH = r'''
import io, os, shlex, subprocess, sys, tarfile
node, command = sys.argv[1], sys.argv[2]
if node == "node-dead":
    sys.stderr.write("ssh: connect to host node-dead port 22: No route to host\n")
    sys.exit(255)
if node == "node-hostile":  # a stream no node_logs writes: names out of the folder, a link, a device
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as t:
        for name in ("../escaped.txt", "/tmp/absolute.txt", "run/../../up.txt", "ok/fine.txt"):
            data = b"x"
            info = tarfile.TarInfo(name)
            info.size = 1
            t.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("run/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
        hard = tarfile.TarInfo("run/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
        t.addfile(hard)
    sys.exit(0)
root = os.path.join(os.environ["FAKE_NODES"], node)
sys.exit(subprocess.call(["bash", "-c", command + " --node-root " + shlex.quote(root)]))
'''


def _file(path: Path, text: str, mtime: float | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def make_node(nodes: Path, name: str, role: str, stamp: str, ranks: range) -> Path:
    """A node's root: its run folder (and older runs), a Ray session, flight-recorder dumps, CANN logs."""
    root = nodes / name
    run = root / "jobs/logs" / f"a3_256die_true_weight-{stamp}-{role}-{name}"
    _file(run / "launcher.log", f"{name} launcher\nverl_patches hang: ...\n")
    _file(run / "trainer.log" if role == "head" else run / "ray.log", f"{name} log\n")
    _file(run / "tensorboard/events.out", "tb")
    (run / "passwd").symlink_to("/etc/passwd")  # never followed out of the folder
    (run / "outside").symlink_to(root / "jobs")
    _file(root / "jobs/logs/a3_256die_true_weight-20250601-100000-head-old/launcher.log", "an older run")
    _file(root / "jobs/logs/a3_256die_random_init-20250701-134010-head-x/launcher.log", "another profile")
    session = root / "tmp/ray/session_2025-07-01_13-40-05_123456_1"
    _file(session / "logs/worker-abc-01000000-48211.out", f"{name} worker output\n")
    _file(session / "logs/raylet.out", "raylet\n")
    (root / "tmp/ray/session_latest").symlink_to(session)
    _file(root / "tmp/ray/session_2025-06-01_10-00-00_1_1/logs/raylet.out", "an older session")
    for r in ranks:
        _file(root / f"tmp/hccl_trace_rank_{r}", f"dump {r}", START + 600)
        _file(root / f"tmp/hccl_trace_rank_{r}_py_traceback", f"stack {r}", START + 600)
    _file(root / "tmp/hccl_trace_rank_999", "a dump from last month", START - 30 * 86400)
    _file(root / "home/ascend/log/debug/plog/plog-1.log", "hccl error", START + 700)
    return root


@pytest.fixture
def cluster(tmp_path):
    nodes = tmp_path / "nodes"
    make_node(nodes, "node-a", "head", "20250701-134002", range(0, 2))
    make_node(nodes, "node-b", "worker", "20250701-133958", range(2, 4))
    ssh = tmp_path / "fake_ssh.py"
    ssh.write_text(FAKE_SSH)
    env_file = tmp_path / "cluster.env"
    env_file.write_text("NNODES=4\nNODES=node-a,node-b,node-dead,node-hostile\nWAIT_TIMEOUT_S=1800\n")
    return nodes, ssh, env_file


def gather(tmp_path, nodes, ssh, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "verl_patches.launch.gather_logs", "--run-dir", f"/jobs/logs/{HEAD_RUN}"]
    cmd += ["--out", str(tmp_path / "out"), "--remote-shell", f"{sys.executable} {ssh}"]
    cmd += ["--ray-dir", "/tmp/ray", "--flight-recorder-prefix", "/tmp/hccl_trace_rank_"]
    cmd += ["--ascend-log-dir", "/home/ascend/log", *extra]
    env = {**os.environ, "FAKE_NODES": str(nodes)}
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)


def test_every_node_of_the_run_lands_in_its_folder(tmp_path, cluster):
    nodes, ssh, env_file = cluster
    r = gather(tmp_path, nodes, ssh, "--env-file", str(env_file))
    assert r.returncode == 1, r.stdout + r.stderr  # the dead node fails the gathering, the others are there
    out = tmp_path / "out"
    a = out / "node-a"
    assert (a / f"run/{HEAD_RUN}/launcher.log").read_text() == "node-a launcher\nverl_patches hang: ...\n"
    assert (a / f"run/{HEAD_RUN}/trainer.log").is_file() and (a / f"run/{HEAD_RUN}/tensorboard/events.out").is_file()
    worker_run = out / "node-b/run/a3_256die_true_weight-20250701-133958-worker-node-b"
    assert (worker_run / "ray.log").read_text() == "node-b log\n"  # started 4 s before the head: same run
    assert (out / "node-b/ray/session_2025-07-01_13-40-05_123456_1/logs/worker-abc-01000000-48211.out").is_file()
    assert sorted(p.name for p in (out / "node-b/flight_recorder").iterdir()) == [
        "hccl_trace_rank_2",
        "hccl_trace_rank_2_py_traceback",
        "hccl_trace_rank_3",
        "hccl_trace_rank_3_py_traceback",
    ]
    assert (out / "node-a/ascend/debug/plog/plog-1.log").read_text() == "hccl error"
    # not of this run: an older run folder, another profile, an old Ray session, last month's dump
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert not [f for f in files if "old" in f or "random_init" in f or "2025-06-01" in f or "rank_999" in f]
    # links are listed as skipped, never followed (no copy of /etc/passwd, no second copy of the node's jobs/)
    assert not [p for p in out.rglob("*") if p.is_symlink()]
    assert not (a / f"run/{HEAD_RUN}/passwd").exists() and not (a / f"run/{HEAD_RUN}/outside").exists()
    summary = json.loads((out / "gather.json").read_text())
    by_node = {n["node"]: n for n in summary["nodes"]}
    assert by_node["node-a"]["ok"] and by_node["node-b"]["ok"]
    assert {s["why"] for s in by_node["node-a"]["manifest"]["skipped"]} == {"a symbolic link (not followed)"}
    assert "node node-dead: FAILED: exit 255: ssh: connect to host node-dead port 22: No route to host" in r.stdout
    assert "2 of 4 nodes gathered" in r.stdout and "failed: node-dead, node-hostile" in r.stdout


def test_a_hostile_stream_writes_nothing_outside_its_node_folder(tmp_path, cluster):
    nodes, ssh, _ = cluster
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-hostile")
    assert r.returncode == 1, r.stdout + r.stderr  # no manifest: not node_logs' output
    out = tmp_path / "out"
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink())
    assert written == ["gather.json", "node-hostile/ok/fine.txt"]
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()
    refused = json.loads((out / "gather.json").read_text())["nodes"][0]["refused"]
    assert len(refused) == 5 and "'run/link': not a plain file" in refused


def test_an_existing_node_folder_is_never_written_into(tmp_path, cluster):
    nodes, ssh, _ = cluster
    (tmp_path / "out/node-a").mkdir(parents=True)
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a")
    assert r.returncode == 2 and "out/node-a exists; choose a new --out" in r.stderr


def test_the_nodes_come_from_the_env_file_and_must_be_nnodes(tmp_path, cluster):
    nodes, ssh, _ = cluster
    bad = tmp_path / "bad.env"
    bad.write_text("NNODES=16\nNODES=node-a,node-b\n")
    r = gather(tmp_path, nodes, ssh, "--env-file", str(bad))
    assert r.returncode == 2 and "NODES" in r.stderr and "lists 2 node(s), NNODES is 16" in r.stderr
    bad.write_text("NNODES=2\nNODES=node-a,../etc\n")
    r = gather(tmp_path, nodes, ssh, "--env-file", str(bad))
    assert r.returncode == 2 and "neither an IP address nor a host name" in r.stderr


@pytest.mark.parametrize("name", ["../x", "/abs", "a/../../b", "a//b", "a/./b", "", "a\nb", "a\\b"])
def test_member_names_that_could_leave_the_folder_are_refused(name):
    assert member_parts(name) is None


def test_a_plain_member_name_is_kept():
    assert member_parts("run/a3-20250701-134002-head-n/trainer.log") == [
        "run",
        "a3-20250701-134002-head-n",
        "trainer.log",
    ]


def test_a_large_file_is_cut_to_its_end(tmp_path):
    """The end of a log explains a failure: a file over --max-file-mib keeps its last bytes."""
    nodes = tmp_path / "nodes"
    root = make_node(nodes, "node-a", "head", "20250701-134002", range(1))
    big = root / f"jobs/logs/{HEAD_RUN}/trainer.log"
    big.write_bytes(b"a" * (2 << 20) + b"THE END\n")
    r = subprocess.run(
        [sys.executable, "-m", "verl_patches.launch.node_logs", "--run-dir", f"/jobs/logs/{HEAD_RUN}"]
        + ["--node-root", str(root), "--max-file-mib", "1", "--ray-dir", "/tmp/ray"],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r|") as t:
        members = {m.name: t.extractfile(m).read() if m.isfile() else None for m in t}
    data = members[f"run/{HEAD_RUN}/trainer.log"]
    assert len(data) == 1 << 20 and data.endswith(b"THE END\n")
    manifest = json.loads(members["gather_manifest.json"])
    assert manifest["truncated"] == [f"run/{HEAD_RUN}/trainer.log: last {1 << 20} of {(2 << 20) + 8} bytes"]
