"""gather_logs: every node's run folders, Ray worker logs, HCCL flight-recorder dumps and CANN logs of one run in
``<out>/<node>/``. Fake nodes are folders (each a node's filesystem root) reached through a fake remote shell
that runs the real node side (`node_logs`) under that root; one node is dead, one sends a hostile stream, one
leaves a child holding the pipe. The node side is attacked with real files: links at depth, folders and files
swapped for links between listing and opening, hard links, FIFOs, sockets, odd names, foreign owners."""

from __future__ import annotations

import io
import json
import os
import socket
import stat
import subprocess
import sys
import tarfile
import time
from argparse import Namespace
from pathlib import Path

import pytest

from verl_patches.launch.cluster import node_logs
from verl_patches.launch.cluster.gather_logs import file_mode, member_parts, printable, read_manifest

ROOT = Path(__file__).resolve().parents[3]
HEAD_RUN = "a3_256die_true_weight-20250701-134002-head-node-a"
START = time.mktime(time.strptime("20250701-134002", "%Y%m%d-%H%M%S"))
SESSION = "session_2025-07-01_13-40-05_123456_1"
SECRET = b"-----BEGIN OPENSSH PRIVATE KEY----- the gathering user's key"

FAKE_SSH = r'''
import io, os, shlex, subprocess, sys, tarfile
node, command = sys.argv[1], sys.argv[2]
if node == "node-dead":
    sys.stderr.write("ssh: connect to host node-dead port 22: No route to host\n")
    sys.exit(255)
if node == "node-hostile":  # a stream no node_logs writes: names out of the folder, a link, a device
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as t:
        names = ("../escaped.txt", "/tmp/absolute.txt", "run/../../up.txt", "ok/fine.txt", "bad\udcffname")
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mode = 1, 0o4777
            t.addfile(info, io.BytesIO(b"x"))
        link = tarfile.TarInfo("run/link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        t.addfile(link)
        hard = tarfile.TarInfo("run/hard")
        hard.type, hard.linkname = tarfile.LNKTYPE, "/etc/passwd"
        t.addfile(hard)
        manifest = tarfile.TarInfo("gather_manifest.json")
        manifest.size = 3
        t.addfile(manifest, io.BytesIO(b"NaN"))
    sys.exit(0)
if node in ("node-hang", "node-escape"):  # a child that keeps stdout open and sleeps; the shell itself exits
    child = subprocess.Popen(["sleep", "300"], start_new_session=node == "node-escape")
    with open(os.path.join(os.environ["FAKE_PIDS"], node), "w") as f:
        f.write(str(child.pid))
    sys.exit(0)
if node == "node-cut":  # a member announced at 1 MiB, cut off after 10 bytes
    header = tarfile.TarInfo("run/cut.log")
    header.size = 1 << 20
    sys.stdout.buffer.write(header.tobuf(tarfile.PAX_FORMAT) + b"x" * 10)
    sys.exit(0)
if node == "node-flood":  # never ends, never exits: zeros without end
    while True:
        sys.stdout.buffer.write(bytes(1 << 20))
root = os.path.join(os.environ["FAKE_NODES"], node)
sys.exit(subprocess.call(["bash", "-c", command + " --node-root " + shlex.quote(root)]))
'''


def _file(path: Path, text: str | bytes, mtime: float | None = None, mode: int | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    if mode is not None:
        path.chmod(mode)
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def make_node(nodes: Path, name: str, role: str, stamp: str, ranks: range) -> Path:
    """A node's root: its run folder (and older runs), a Ray session, flight-recorder dumps, CANN logs."""
    root = nodes / name
    run = root / "jobs/logs" / f"a3_256die_true_weight-{stamp}-{role}-{name}"
    _file(run / "launcher.log", f"{name} launcher\nverl_patches hang: ...\n")
    _file(run / "trainer.log" if role == "head" else run / "ray.log", f"{name} log\n", mode=0o600)
    _file(run / "tensorboard/events.out", "tb", mode=0o755)
    (run / "passwd").symlink_to("/etc/passwd")  # never followed out of the folder
    (run / "outside").symlink_to(root / "jobs")
    _file(root / "jobs/logs/a3_256die_true_weight-20250601-100000-head-old/launcher.log", "an older run")
    _file(root / "jobs/logs/a3_256die_random_init-20250701-134010-head-x/launcher.log", "another profile")
    session = root / "tmp/ray" / SESSION
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


def gather(tmp_path, nodes, ssh, *extra: str, cwd: Path = ROOT, as_file: bool = False) -> subprocess.CompletedProcess:
    tool = (
        [str(ROOT / "verl_patches/launch/cluster/gather_logs.py")]
        if as_file
        else ["-m", "verl_patches.launch.cluster.gather_logs"]
    )
    cmd = [sys.executable, *tool, "--run-dir", f"/jobs/logs/{HEAD_RUN}"]
    cmd += ["--out", str(tmp_path / "out"), "--remote-shell", f"{sys.executable} {ssh}"]
    cmd += ["--ray-dir", "/tmp/ray", "--flight-recorder-prefix", "/tmp/hccl_trace_rank_"]
    cmd += ["--ascend-log-dir", "/home/ascend/log", *extra]
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    env = {**os.environ, "FAKE_NODES": str(nodes), "FAKE_PIDS": str(pids)}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


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
    assert (out / f"node-b/ray/{SESSION}/logs/worker-abc-01000000-48211.out").is_file()
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
    # private: the folder and every folder in it 0700; a file's mode never wider than its source's, never exec
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in [out, *out.rglob("*")] if p.is_dir())
    assert stat.S_IMODE((a / f"run/{HEAD_RUN}/trainer.log").stat().st_mode) == 0o600
    assert stat.S_IMODE((a / f"run/{HEAD_RUN}/tensorboard/events.out").stat().st_mode) & 0o111 == 0
    summary = json.loads((out / "gather.json").read_text())
    by_node = {n["node"]: n for n in summary["nodes"]}
    assert by_node["node-a"]["ok"] and by_node["node-b"]["ok"]
    assert {s["why"] for s in by_node["node-a"]["manifest"]["skipped"]} == {"a symbolic link (not followed)"}
    assert "node node-dead: FAILED: exit 255: ssh: connect to host node-dead port 22: No route to host" in r.stdout
    assert "2 of 4 nodes gathered" in r.stdout and "failed: node-dead, node-hostile" in r.stdout


def test_a_hostile_stream_writes_nothing_outside_its_node_folder(tmp_path, cluster):
    nodes, ssh, _ = cluster
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-hostile")
    assert r.returncode == 1, r.stdout + r.stderr  # its manifest is no JSON object: not node_logs' output
    assert "Traceback" not in r.stderr
    out = tmp_path / "out"
    written = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() or p.is_symlink())
    assert written == ["gather.json", "node-hostile/ok/fine.txt"]
    assert stat.S_IMODE((out / "node-hostile/ok/fine.txt").stat().st_mode) == 0o644  # sent as setuid 4777
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/absolute.txt").exists()
    node = json.loads((out / "gather.json").read_text())["nodes"][0]
    assert len(node["refused"]) == 6 and "'run/link': not a plain file" in node["refused"]
    assert "gather_manifest.json is not JSON" in node["error"]


def test_an_existing_out_is_refused_by_name_and_nothing_is_written_through_it(tmp_path, cluster):
    nodes, ssh, _ = cluster
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("not yours")
    (out / "gather.json").symlink_to(victim)  # planted where the summary goes
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a")
    assert (
        r.returncode == 2
        and r.stderr == f"gather_logs: --out {out} exists; choose a new folder (gather_logs never writes into one)\n"
    )
    assert victim.read_text() == "not yours" and sorted(p.name for p in out.iterdir()) == ["gather.json"]
    out.rename(tmp_path / "moved")
    out.symlink_to(tmp_path / "nowhere")  # a dangling link in --out's place: exists too
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a")
    assert r.returncode == 2 and "exists; choose a new folder" in r.stderr and not (tmp_path / "nowhere").exists()


def test_a_child_that_keeps_the_pipe_is_ended_at_the_time_out(tmp_path, cluster):
    nodes, ssh, _ = cluster
    began = time.monotonic()
    r = gather(
        tmp_path, nodes, ssh, "--nodes", "node-hang,node-escape,node-a", "--timeout-s", "3", "--window-s", "1800"
    )
    took = time.monotonic() - began
    pids = {n: int((tmp_path / "pids" / n).read_text()) for n in ("node-hang", "node-escape")}
    try:
        assert r.returncode == 1 and took < 20, (took, r.stdout + r.stderr)
        for node in ("node-hang", "node-escape"):
            ended = "its remote shell and the processes it started were ended"
            assert f"node {node}: FAILED: timed out after 3 s (--timeout-s); {ended}" in r.stdout
        assert "node node-a: " in r.stdout and "1 of 3 nodes gathered" in r.stdout  # the others are still gathered
        assert _ended(pids["node-hang"]), "the child left in the remote shell's process group still runs"
    finally:
        for pid in pids.values():  # the escaped child left its group: the test that started it ends it
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass


def _ended(pid: int, wait_s: float = 5.0) -> bool:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] == "Z":
                return True  # killed; its parent (init in a container) has not reaped it yet
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.timeout(120)
def test_a_node_that_floods_the_pipe_is_stopped_at_its_budget(tmp_path, cluster):
    nodes, ssh, _ = cluster
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-flood", "--max-node-gib", "0.001", "--timeout-s", "60")
    assert r.returncode == 1 and "sent more than" in r.stdout and "were ended" in r.stdout, r.stdout + r.stderr


def test_a_file_the_stream_broke_off_in_is_not_left_half_written(tmp_path, cluster):
    nodes, ssh, _ = cluster
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-cut")
    assert r.returncode == 1 and "node node-cut: FAILED: the stream broke off (unexpected end of data)" in r.stdout
    assert not (tmp_path / "out/node-cut/run/cut.log").exists()


def test_it_runs_from_any_folder_as_a_file(tmp_path, cluster):
    nodes, ssh, _ = cluster
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a", "--window-s", "1800", cwd=elsewhere, as_file=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / f"out/node-a/run/{HEAD_RUN}/launcher.log").is_file()


@pytest.mark.parametrize(
    "flag,value,message",
    [
        ("--timeout-s", "inf", "expected a finite decimal number, got 'inf'"),
        ("--timeout-s", "nan", "expected a finite decimal number, got 'nan'"),
        ("--timeout-s", "-1", "must be above 0 and at most 1e+06, got -1"),
        ("--max-node-gib", "0", "must be above 0"),
        ("--jobs", "0", "must be at least 1, got 0"),
        ("--remote-shell", "ssh '-o", "not a command line (No closing quotation)"),
    ],
)
def test_bad_flags_are_one_line_and_make_nothing(tmp_path, cluster, flag, value, message):
    nodes, ssh, _ = cluster
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a", flag, value)
    assert r.returncode == 2 and f"argument {flag}: {message}" in r.stderr.splitlines()[-1], r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "out").exists()


def test_the_nodes_come_from_the_env_file_and_must_be_nnodes(tmp_path, cluster):
    nodes, ssh, _ = cluster
    bad = tmp_path / "bad.env"
    bad.write_text("NNODES=16\nNODES=node-a,node-b\n")
    r = gather(tmp_path, nodes, ssh, "--env-file", str(bad))
    assert r.returncode == 2 and "NODES" in r.stderr and "lists 2 node(s), NNODES is 16" in r.stderr
    bad.write_text("NNODES=2\nNODES=node-a,../etc\n")
    r = gather(tmp_path, nodes, ssh, "--env-file", str(bad))
    assert r.returncode == 2 and "neither an IP address nor a host name" in r.stderr
    r = gather(tmp_path, nodes, ssh, "--nodes", "node-a,node-a")
    assert r.returncode == 2 and "--nodes: node-a listed more than once" in r.stderr
    r = gather(tmp_path, nodes, ssh, "--nodes", "gather.json")
    assert r.returncode == 2 and "would share its folder with the summary" in r.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name", ["../x", "/abs", "a/../../b", "a//b", "a/./b", "", "a\nb", "a\\b", "a\x7fb", "bad\udcffname", "x/" * 40]
)
def test_member_names_that_could_leave_the_folder_are_refused(name):
    assert member_parts(name) is None


def test_a_plain_member_name_is_kept():
    assert member_parts("run/a3-20250701-134002-head-n/trainer.log") == [
        "run",
        "a3-20250701-134002-head-n",
        "trainer.log",
    ]


def test_modes_text_and_manifests_from_a_node_are_data():
    assert [file_mode(m) for m in (0o4777, 0o600, 0o755, 0o666, True, "0777", None)] == [
        0o644,
        0o600,
        0o644,
        0o644,
        0o600,
        0o600,
        0o600,
    ]
    assert printable("ok\x1b[2J\nrm -rf\udcff") == "ok\\x1b[2J\\nrm -rf\\udcff"
    for bad in (b"NaN", b"[1]", b"{", b"[" * 100000, b"\xff"):
        with pytest.raises(ValueError, match="gather_manifest.json"):
            read_manifest(bad)
    assert read_manifest(b'{"parts": {}}') == {"parts": {}}


# --- the node side, attacked with real files -------------------------------------------------------------


def node_args(root: Path, **over) -> Namespace:
    args = {
        "run_dir": f"/jobs/logs/{HEAD_RUN}",
        "window_s": 1800.0,
        "ray_dir": "/tmp/ray",
        "flight_recorder_prefix": "/tmp/hccl_trace_rank_",
        "ascend_log_dir": "/home/ascend/log",
        "max_file_mib": 256.0,
        "max_node_gib": 16.0,
        "deadline_s": 600.0,
        "node_root": str(root),
    }
    return Namespace(**{**args, **over})


def stream(root: Path, **over) -> tuple[dict[str, bytes], dict]:
    """What node_logs sends for the fake node at `root`: member name -> bytes, and its manifest."""
    buf = io.BytesIO()
    node_logs.write_stream(buf, node_args(root, **over))
    buf.seek(0)
    with tarfile.open(fileobj=buf, mode="r|") as t:
        members = {m.name: t.extractfile(m).read() for m in t if m.isfile()}
    return members, json.loads(members.pop(node_logs.MANIFEST))


def why(manifest: dict, path_end: str) -> str:
    hits = [s["why"] for s in manifest["skipped"] if s["path"].endswith(path_end)]
    assert len(hits) == 1, (path_end, manifest["skipped"])
    return hits[0]


@pytest.fixture
def node(tmp_path) -> tuple[Path, Path, Path]:
    """A fake node, its head run folder, and the gathering user's secret outside every walked folder."""
    root = make_node(tmp_path / "nodes", "node-a", "head", "20250701-134002", range(1))
    secret = _file(root / "home/user/.ssh/id_ed25519", SECRET, mode=0o600)
    return root, root / f"jobs/logs/{HEAD_RUN}", secret


def assert_secret_not_sent(members: dict[str, bytes]) -> None:
    assert not [name for name, data in members.items() if SECRET in data]


def test_links_at_any_depth_are_listed_never_followed(node):
    root, run, secret = node
    deep = run / "a/b/c"
    deep.mkdir(parents=True)
    (deep / "key").symlink_to(secret)
    (deep / "ssh").symlink_to(secret.parent)
    (root / "tmp/ray" / SESSION / "logs/sub").symlink_to(secret.parent)
    members, manifest = stream(root)
    assert_secret_not_sent(members)
    assert why(manifest, "a/b/c/key") == why(manifest, "a/b/c/ssh") == "a symbolic link (not followed)"
    assert why(manifest, "logs/sub") == "a symbolic link (not followed)"


def test_a_root_reached_through_a_link_is_refused(node):
    root, _, secret = node
    (root / "tmp/ray").rename(root / "tmp/ray-real")
    (root / "tmp/ray").symlink_to(secret.parent)  # /tmp/ray planted as a link by another account
    members, manifest = stream(root)
    assert_secret_not_sent(members)
    assert why(manifest, "/tmp/ray") == "a symbolic link at /tmp/ray (not followed; give the real path)"
    assert f"run/{HEAD_RUN}/launcher.log" in members  # the rest of the node is still sent


def _swap_for_link(folder: Path, target: Path) -> None:
    folder.rename(folder.with_name(folder.name + ".moved"))
    folder.symlink_to(target)


def test_a_folder_swapped_for_a_link_after_it_was_listed_is_not_followed(node, monkeypatch):
    """The attack that copied a private key: the folder is a real folder when listed, a link to ~/.ssh by the
    time the walker opens it. Played both between the listing and the stat, and between the stat and the open."""
    root, run, secret = node
    for sub in ("early", "late"):
        _file(run / sub / "x.log", "x")
    real_listdir, real_stat = os.listdir, os.stat

    def listdir(fd=None):
        names = real_listdir(fd)
        if "early" in names and not (run / "early.moved").exists():
            _swap_for_link(run / "early", secret.parent)
        return names

    def stat_(name, *a, **kw):
        result = real_stat(name, *a, **kw)
        if name == "late" and kw.get("dir_fd") is not None and not (run / "late.moved").exists():
            _swap_for_link(run / "late", secret.parent)
        return result

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "stat", stat_)
    members, manifest = stream(root)
    assert_secret_not_sent(members)
    assert why(manifest, f"{HEAD_RUN}/early") == "a symbolic link (not followed)"
    assert why(manifest, f"{HEAD_RUN}/late") == "replaced by a link or a file while gathered (not followed)"


def test_a_file_swapped_for_a_link_or_a_hard_link_is_not_sent(node, monkeypatch):
    root, run, secret = node
    _file(run / "swapped.log", "mine")
    _file(run / "hard.log", "mine")
    _file(run / "renamed.log", "mine")
    os.link(secret, run / "planted-hard-link")  # a hard link to a file of elsewhere, there before the walk
    real_open = os.open

    def open_(path, flags, *a, **kw):
        if (
            kw.get("dir_fd") is not None
            and path in ("swapped.log", "hard.log")
            and not (run / f"{path}.moved").exists()
        ):
            os.rename(run / path, run / f"{path}.moved")
            if path == "swapped.log":
                os.symlink(secret, run / path)
            else:
                os.link(secret, run / path)
        return real_open(path, flags, *a, **kw)

    monkeypatch.setattr(os, "open", open_)
    members, manifest = stream(root)
    assert_secret_not_sent(members)
    assert why(manifest, "swapped.log") == "replaced by a symbolic link while gathered (not followed)"
    assert why(manifest, "hard.log") == "replaced while gathered (not the entry listed)"
    assert why(manifest, "planted-hard-link").endswith(" hard links: it may be a file of another folder (not sent)")
    assert members[f"run/{HEAD_RUN}/renamed.log"] == b"mine"


def test_a_folder_moved_away_while_walked_is_read_where_it_went_not_through_the_link(node, monkeypatch):
    root, run, secret = node
    _file(run / "sub/a.log", "a")
    _file(run / "sub/b.log", "b")
    real_stat = os.stat

    def stat_(name, *a, **kw):
        if name == "b.log" and not (run / "sub.moved").exists():  # inside sub, with sub already open
            _swap_for_link(run / "sub", secret.parent)
        return real_stat(name, *a, **kw)

    monkeypatch.setattr(os, "stat", stat_)
    members, _ = stream(root)
    assert_secret_not_sent(members)
    assert members[f"run/{HEAD_RUN}/sub/a.log"] == b"a" and members[f"run/{HEAD_RUN}/sub/b.log"] == b"b"


@pytest.mark.timeout(60)
def test_fifos_sockets_odd_names_and_unreadable_files_are_skipped_with_a_reason(node, monkeypatch):
    root, run, _ = node
    os.mkfifo(run / "fifo")
    os.mkfifo(root / "tmp/hccl_trace_rank_7")  # a FIFO where a dump would be: never opened
    sock = socket.socket(socket.AF_UNIX)
    monkeypatch.chdir(run)  # a socket's path is at most 107 bytes: bound by its short relative name
    sock.bind("sock")
    fd = os.open(os.fsencode(run) + b"/bad\xffname.log", os.O_WRONLY | os.O_CREAT, 0o644)
    os.close(fd)
    _file(run / "new\nline.log", "x")
    _file(run / "back\\slash.log", "x")
    _file(run / "locked.log", "x", mode=0o000)
    members, manifest = stream(root)
    sock.close()
    assert why(manifest, f"{HEAD_RUN}/fifo") == why(manifest, "hccl_trace_rank_7") == "a FIFO (named pipe)"
    assert why(manifest, "/sock") == "a socket"
    assert why(manifest, "bad\\xffname.log") == "a name that is not UTF-8"
    assert why(manifest, "new\\nline.log") == "a name with a control character (newline, tab, ...)"
    assert why(manifest, "back\\\\slash.log") == "a name with a backslash"
    if os.geteuid() != 0:  # root reads a mode-000 file
        assert why(manifest, "locked.log") == "unreadable (Permission denied)"
    assert f"run/{HEAD_RUN}/launcher.log" in members


def test_odd_session_and_run_folder_names_never_stop_the_gathering(node):
    root, _, _ = node
    ray = root / "tmp/ray"
    _file(ray / "session_2025-13-45_99-99-99_1_1/logs/x.out", "no such time")
    _file(ray / "session_２０２５-07-01_13-40-05_1_1/logs/x.out", "not ASCII digits")
    os.makedirs(os.fsencode(ray) + b"/session_\xff")
    _file(ray / "session_2025-07-01_13-40-06_1_1", "a file, not a folder")
    (ray / "session_2025-07-01_13-40-07_1_1").mkdir()  # no logs folder
    _file(root / "jobs/logs/a3_256die_true_weight-20251399-999999-head-x/launcher.log", "bad stamp")
    members, manifest = stream(root)
    assert why(manifest, "session_2025-13-45_99-99-99_1_1") == "its time stamp is no valid time"
    assert why(manifest, "a3_256die_true_weight-20251399-999999-head-x") == "its time stamp is no valid time"
    assert why(manifest, "session_2025-07-01_13-40-06_1_1") == "a file, not a folder"
    assert why(manifest, "session_2025-07-01_13-40-07_1_1/logs") == "no logs folder"
    assert not [m for m in members if "２" in m or "13-45" in m]
    assert f"ray/{SESSION}/logs/raylet.out" in members


def test_a_huge_file_is_cut_to_its_end_and_the_node_budget_holds(node):
    root, run, _ = node
    with open(run / "huge.log", "wb") as f:  # sparse: 8 GiB on paper, nothing on disk
        f.truncate(8 << 30)
        f.seek((8 << 30) - 8)
        f.write(b"THE END\n")
    members, manifest = stream(root, max_file_mib=1.0)
    data = members[f"run/{HEAD_RUN}/huge.log"]
    assert len(data) == 1 << 20 and data.endswith(b"THE END\n")
    assert f"run/{HEAD_RUN}/huge.log: last {1 << 20} of {8 << 30} bytes" in manifest["truncated"]
    members, manifest = stream(root, max_node_gib=40 / (1 << 30))  # 40 bytes for the whole node
    assert sum(len(v) for v in members.values()) <= 40
    assert any(s["why"].startswith("over --max-node-gib") for s in manifest["skipped"])


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another account")
def test_files_and_folders_of_another_account_are_not_sent(node):
    root, run, _ = node
    theirs = _file(run / "theirs.log", "planted")
    os.chown(theirs, 4242, 4242)
    session = root / "tmp/ray" / SESSION
    os.chown(session, 4242, 4242)
    members, manifest = stream(root)
    assert why(manifest, "theirs.log") == f"owned by uid 4242, not by this account (uid {os.geteuid()})"
    assert why(manifest, SESSION) == f"owned by uid 4242, not by this account (uid {os.geteuid()})"
    assert not [m for m in members if m.startswith("ray/") or m.endswith("theirs.log")]


def test_the_manifest_lists_stay_bounded(node, monkeypatch):
    root, run, _ = node
    monkeypatch.setattr(node_logs, "MAX_LISTED", 3)
    for i in range(6):
        os.mkfifo(run / f"fifo{i}")
    _, manifest = stream(root)
    assert len(manifest["skipped"]) == 3 and manifest["not_listed"] >= 3


def test_a_run_dir_or_root_with_dot_dot_is_refused_in_one_line(node):
    root, _, _ = node
    with pytest.raises(node_logs.NodeLogsError, match=r"--ray-dir /tmp/\.\./etc: give a plain path"):
        stream(root, ray_dir="/tmp/../etc")
    with pytest.raises(node_logs.NodeLogsError, match="not a run folder of the launcher"):
        stream(root, run_dir="/jobs/logs/a3-20251399-999999-head-x")


def test_a_large_file_is_cut_to_its_end_through_the_command(tmp_path):
    """The end of a log explains a failure: a file over --max-file-mib keeps its last bytes."""
    nodes = tmp_path / "nodes"
    root = make_node(nodes, "node-a", "head", "20250701-134002", range(1))
    big = root / f"jobs/logs/{HEAD_RUN}/trainer.log"
    big.write_bytes(b"a" * (2 << 20) + b"THE END\n")
    r = subprocess.run(
        [sys.executable, "-m", "verl_patches.launch.cluster.node_logs", "--run-dir", f"/jobs/logs/{HEAD_RUN}"]
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
