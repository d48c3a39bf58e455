"""The launcher's files and its cleanup (issue 32 items 3 and 4; issue 41 class 4): a new private run folder
every time, written through its descriptor, files created without following links, a LOG_DIR others can
write refused (or, sticky, named); the wait for the trainer cannot be held
by a leftover's open pipe; a leftover that left the session (setsid) is still found, ended and named; a
process is signalled only through its identity; malformed heartbeats are named, never a traceback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from verl_patches.launch.run_dir import LogDirError, check_log_root, new_run_dir, open_new
from verl_patches.process_identity import ProcessId, signal_if_same, start_ticks

REPO = Path(__file__).resolve().parents[2]


def test_a_log_root_others_can_write_is_refused_or_named(tmp_path: Path) -> None:
    root = tmp_path / "logs"
    root.mkdir()
    root.chmod(0o755)
    assert check_log_root(root) == ""
    root.chmod(0o777)
    with pytest.raises(LogDirError, match=f"LOG_DIR {root}: writable by every user and not sticky"):
        check_log_root(root)
    root.chmod(0o1777)  # like /tmp: others may create, not replace what is ours
    assert "writable by others" in check_log_root(root)
    root.chmod(0o775)  # a group member could rename the run folder away and put a link in its place
    with pytest.raises(LogDirError, match=f"LOG_DIR {root}: others could replace the run folder there"):
        check_log_root(root)
    root.chmod(0o755)
    tmp_path.chmod(0o777)  # a level above: the same, naming that level
    with pytest.raises(LogDirError, match=f"\\({tmp_path}: writable by group/others and not sticky"):
        check_log_root(root)
    tmp_path.chmod(0o700)


def test_the_run_folder_is_never_reused_and_no_file_follows_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    name = "tiny-20261126-120000-local-host"
    planted = tmp_path / name
    planted.mkdir()
    (planted / "launcher.log").symlink_to(victim)  # another account guessed the name and planted links
    (planted / "pids.json").symlink_to(victim)
    (tmp_path / f"{name}-1").symlink_to(tmp_path)  # even a link of the next name
    run = new_run_dir(tmp_path, name)
    assert run.path == tmp_path / f"{name}-2" and run.path.is_dir() and not run.path.is_symlink()
    assert run.path.stat().st_mode & 0o777 == 0o700  # private: no one else can add or replace a file in it
    with run.open_new("launcher.log", "a") as f:
        f.write("ok\n")
    os.symlink(victim, run.path / "trainer.log")
    with pytest.raises(FileExistsError):
        run.open_new("trainer.log")
    with pytest.raises(FileExistsError):
        open_new(run.path / "trainer.log")  # the by-path form, for the Ray node's log, refuses it too
    assert victim.read_text() == "precious"
    run.close()


def test_a_run_folder_swapped_for_a_link_after_it_is_made_does_not_redirect_the_launcher(
    tmp_path: Path, monkeypatch
) -> None:
    """Issue 41 class 4: the run folder is written through its descriptor, never by path: renaming it away and
    putting a link to another account's folder in its place sends pids.json, launcher.log and trainer.log
    nowhere but into the folder the launch made."""
    from verl_patches.launch import job

    logs, theirs = tmp_path / "logs", tmp_path / "theirs"
    logs.mkdir()
    theirs.mkdir()
    monkeypatch.setattr(job, "become_subreaper", lambda: False)
    launch = job.Launch(
        SimpleNamespace(tiny=True, profile="a3"),
        SimpleNamespace(get=lambda k: str(logs) if k == "LOG_DIR" else None),
        "local",
    )
    made = launch.log_dir
    moved = logs / "moved"
    os.rename(made, moved)
    made.symlink_to(theirs)
    launch.say("hello")
    launch.record("trainer", 12345)
    rc = job.run_logged(
        [sys.executable, "-c", "print('trainer says hi')"], made / "trainer.log", dict(os.environ), launch, "trainer"
    )
    assert rc == 0 and list(theirs.iterdir()) == []
    recorded = json.loads((moved / "pids.json").read_text())["processes"]
    assert recorded["trainer"]["pid"] != 12345  # the trainer's own pid, recorded
    assert "hello" in (moved / "launcher.log").read_text()
    assert "trainer says hi" in (moved / "trainer.log").read_text()
    assert {p.stat().st_mode & 0o777 for p in moved.iterdir()} == {0o600}
    with pytest.raises(ValueError, match="not a file of this launch's run folder"):
        launch.open_log(tmp_path / "elsewhere.log")


def test_the_launcher_writes_its_pids_and_log_only_in_its_new_folder(tmp_path: Path, monkeypatch) -> None:
    from verl_patches.launch import job

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    settings = SimpleNamespace(get=lambda k: str(tmp_path) if k == "LOG_DIR" else None)
    import socket

    for s in (stamp, time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() + 1))):
        planted = tmp_path / f"tiny-{s}-local-{socket.gethostname()}"
        planted.mkdir(exist_ok=True)
        for f in ("launcher.log", "pids.json", "pids.json.tmp"):
            if not (planted / f).is_symlink():
                (planted / f).symlink_to(victim)
    monkeypatch.setattr(job, "become_subreaper", lambda: False)  # the test process itself stays as it is
    launch = job.Launch(SimpleNamespace(tiny=True, profile="a3"), settings, "local")
    launch.say("hello")
    launch.record("trainer", os.getpid())
    recorded = json.loads((launch.log_dir / "pids.json").read_text())["processes"]  # by pid and start time
    assert launch.log_dir.name.endswith("-1") and {n: e["pid"] for n, e in recorded.items()} == {
        "launcher": os.getpid(),
        "trainer": os.getpid(),
    }
    assert victim.read_text() == "precious"


def test_signal_if_same_never_signals_a_process_by_number_alone() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = start_ticks(p.pid)
        assert started is not None
        assert not signal_if_same(p.pid, started + 1, signal.SIGKILL)  # another start time: another process
        assert not signal_if_same(p.pid, None, signal.SIGKILL)
        time.sleep(0.2)
        assert p.poll() is None
        assert signal_if_same(p.pid, started, signal.SIGTERM)
        assert p.wait(10) == -signal.SIGTERM
        assert not signal_if_same(p.pid, started, signal.SIGKILL)  # gone (and reaped): nothing is signalled
    finally:
        if p.poll() is None:
            p.kill()


# The launcher, in miniature: a subreaper running run_logged on a "trainer" that starts a helper which leaves
# the session (setsid, then a second fork so its parent is gone) and keeps the trainer's stdout open.
LAUNCHER = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from types import SimpleNamespace
    from verl_patches.launch import job, session_leftovers
    session_leftovers.GRACE_S, session_leftovers.TERM_S = 1.0, 1.0
    job.PIPE_DRAIN_S = 1.0
    out = Path(sys.argv[1])
    launch = job.Launch(SimpleNamespace(tiny=True, profile="a3"),
                        SimpleNamespace(get=lambda k: str(out) if k == "LOG_DIR" else None), "local")
    trainer = [sys.executable, "-c", sys.argv[2]]
    start = time.monotonic()
    rc = job.run_logged(trainer, launch.log_dir / "trainer.log", dict(os.environ), launch, "trainer")
    print(json.dumps({"rc": rc, "seconds": time.monotonic() - start, "subreaper": launch.subreaper,
                      "log": str(launch.log_dir)}), flush=True)
""")

TRAINER = textwrap.dedent("""
    import os, sys, time
    if os.fork() == 0:            # the helper
        os.setsid()               # leaves the trainer's session
        if os.fork() == 0:        # and its parent goes: an orphan outside the session
            with open(sys.argv[1] if len(sys.argv) > 1 else os.devnull, "w") as f:
                f.write(str(os.getpid()))
            time.sleep(120)       # holding the trainer's stdout (inherited) open
        os._exit(0)
    time.sleep(0.5)
    print("trainer done", flush=True)
""")


def test_a_leftover_that_left_the_session_and_holds_the_pipe_is_ended_and_named(tmp_path: Path) -> None:
    pidfile = tmp_path / "helper.pid"
    trainer = TRAINER.replace("sys.argv[1] if len(sys.argv) > 1 else os.devnull", repr(str(pidfile)))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "logs"), trainer],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    helper = int(pidfile.read_text())
    assert report["subreaper"] and report["rc"] == 0 and report["seconds"] < 30
    assert start_ticks(helper) is None or ProcessId.of(helper) is None or not ProcessId.of(helper).alive()
    said = (Path(report["log"]) / "launcher.log").read_text()
    assert "ended 1 process(es) of the trainer's session" in said and f"{helper} (" in said
    assert "trainer done" in (Path(report["log"]) / "trainer.log").read_text()


@pytest.mark.parametrize(
    "raw, needle",
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ('{"beat": "x", "pos": {}}', "beat must be"),
        ('{"beat": 1}', "pos must be an object"),
        ('{"beat": 1, "pos": {"marks": "many"}}', "pos.marks must be"),
        ('{"beat": 1, "pos": {"marks": 1, "call": "c", "step": 1, "phase": 3}}', "pos.phase must be"),
        (b"\xff\xfe", "not UTF-8"),
        ('{"beat": 1, "pid": [1], "pos": {"marks": 1, "call": "", "step": null, "phase": "idle"}}', "pid must be"),
    ],
)
def test_a_malformed_heartbeat_is_named_by_the_watch_not_a_traceback(raw, needle) -> None:
    from verl_patches.resilience.call_watch import CallWatch
    from verl_patches.resilience.heartbeat_record import parse_heartbeat

    record, why = parse_heartbeat(raw)
    assert record is None and needle in why
    now = [0.0]
    board = SimpleNamespace(read=lambda keys: {k: raw for k in keys})
    watch = CallWatch("update_actor", 3, {"r0": "rank 0"}, 10.0, board, clock=lambda: now[0])
    assert watch.observe(["r0"]) is None
    now[0] = 11.0
    diagnosis = watch.observe(["r0"])
    assert diagnosis is not None
    text = str(getattr(diagnosis, "message", diagnosis))
    assert "heartbeat value is malformed" in text and needle in text


def test_the_dry_run_refuses_the_log_dir_the_launch_refuses(tmp_path: Path) -> None:
    from verl_patches.launch.preflight.report import log_dir_findings

    root = tmp_path / "logs"
    root.mkdir()
    settings = SimpleNamespace(get=lambda k: str(root) if k == "LOG_DIR" else None)
    root.chmod(0o755)
    assert [f.status for f in log_dir_findings(settings, tmp_path)] == ["ok"]
    root.chmod(0o777)
    (found,) = log_dir_findings(settings, tmp_path)
    assert found.status == "fail" and "writable by every user and not sticky" in found.message
    root.chmod(0o1777)
    assert [f.status for f in log_dir_findings(settings, tmp_path)] == ["warn"]
    root.chmod(0o775)
    (found,) = log_dir_findings(settings, tmp_path)
    assert found.status == "fail" and "others could replace the run folder there" in found.message
    root.chmod(0o755)
