"""A documented stop (issue 42, item 5): the launcher records itself and what it starts in pids.json, by pid and
start time, and `python -m verl_patches.launch.cluster.stop RUN_DIR` ends exactly those: the launcher first as Ctrl-C
would (its own teardown), then what is left with SIGTERM and SIGKILL; never a process whose pid was reused,
never one it did not record, never a record of another node or boot."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.launch.cluster import stop
from verl_patches.launch.pid_record import (
    PidRecord,
    PidRecordError,
    boot_id,
    parse_record,
    read_record,
    record_text,
)
from verl_patches.process_identity import ProcessId, start_ticks

ROOT = Path(__file__).resolve().parents[3]

# A launcher as job.Launch makes it (the real class: run folder, pids.json with itself), with one child it
# records as its trainer; on Ctrl-C it ends the child and exits 130, as the real one's teardown does.
FAKE_LAUNCHER = r"""
import signal, subprocess, sys
from types import SimpleNamespace
from verl_patches.launch import job
job.become_subreaper = lambda: False
settings = SimpleNamespace(get=lambda k: sys.argv[1] if k == "LOG_DIR" else None)
launch = job.Launch(SimpleNamespace(tiny=True, profile="a3"), settings, "local")
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
launch.record("trainer", child.pid)
if sys.argv[2] == "deaf":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
try:  # ready once the folder is printed: Ctrl-C from then on takes the teardown path
    print(launch.log_dir, flush=True)
    child.wait()
except KeyboardInterrupt:
    child.terminate()
    child.wait()
    launch.say("stopped by Ctrl-C")
    sys.exit(130)
"""


@pytest.fixture
def bystander():
    """A process of this user that no launch recorded: it must survive every stop."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    yield p
    p.terminate()
    p.wait(10)


@pytest.fixture
def launcher(tmp_path: Path):
    started: list[subprocess.Popen] = []

    def start(mode: str = "normal") -> tuple[subprocess.Popen, Path]:
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        p = subprocess.Popen(
            [sys.executable, "-c", FAKE_LAUNCHER, str(tmp_path / "logs"), mode],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        started.append(p)
        run_dir = Path(p.stdout.readline().strip())
        assert run_dir.is_dir(), run_dir
        return p, run_dir

    yield start
    for p in started:  # a test that failed before its stop: end what it started, by its own handle
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_the_launcher_records_itself_and_its_children_by_pid_and_start_time(launcher) -> None:
    proc, run_dir = launcher()
    record = read_record(run_dir)
    assert record.host == socket.gethostname() and record.boot_id == boot_id()
    assert set(record.processes) == {"launcher", "trainer"}
    assert record.processes["launcher"] == ProcessId(proc.pid, start_ticks(proc.pid))
    assert record.processes["trainer"].alive()


def test_stop_asks_the_launcher_first_and_leaves_everything_else(launcher, bystander, capsys) -> None:
    proc, run_dir = launcher()
    trainer = read_record(run_dir).processes["trainer"]
    assert stop.main([str(run_dir), "--grace-s", "30", "--term-s", "5"]) == 0
    assert proc.wait(10) == 130  # its own Ctrl-C path ran: it ended its trainer itself
    assert not trainer.alive() and bystander.poll() is None
    out = capsys.readouterr().out
    assert f"launcher {proc.pid}: SIGINT" in out
    assert f"trainer {trainer.pid}: ended by the launcher's teardown" in out
    assert "stop: every recorded process of this run is gone" in out
    assert "stopped by Ctrl-C" in (run_dir / "launcher.log").read_text()
    # a second stop finds nothing to do
    assert stop.main([str(run_dir)]) == 0
    assert "nothing of this run is running" in capsys.readouterr().out


def test_a_launcher_that_ignores_ctrl_c_is_ended_with_sigterm(launcher, bystander, capsys) -> None:
    proc, run_dir = launcher("deaf")
    trainer = read_record(run_dir).processes["trainer"]
    assert stop.main([str(run_dir), "--grace-s", "1", "--term-s", "5"]) == 0
    assert proc.wait(10) == -signal.SIGTERM
    assert not trainer.alive() and bystander.poll() is None
    out = capsys.readouterr().out
    assert f"launcher {proc.pid}: ended by SIGTERM" in out and f"trainer {trainer.pid}: ended by SIGTERM" in out


def write_record(run_dir: Path, processes: dict[str, dict], host: str | None = None, boot: str | None = None) -> None:
    run_dir.mkdir(mode=0o700, exist_ok=True)
    data = {"host": host or socket.gethostname(), "boot_id": boot_id() if boot is None else boot}
    (run_dir / "pids.json").write_text(json.dumps(data | {"processes": processes}))


def test_a_pid_now_held_by_another_process_is_never_signalled(tmp_path: Path, bystander, capsys) -> None:
    ticks = start_ticks(bystander.pid)
    write_record(tmp_path / "run", {"trainer": {"pid": bystander.pid, "start_ticks": ticks - 1}})
    assert stop.main([str(tmp_path / "run"), "--grace-s", "1", "--term-s", "1"]) == 0
    assert bystander.poll() is None
    assert f"trainer {bystander.pid}: not running (or its pid now belongs to another process, left alone)" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "host, boot, why",
    [
        ("elsewhere", "another-boot", "recorded on elsewhere, this is {host}: run the stop on elsewhere"),
        (None, "another-boot", "recorded before {host} last booted: nothing of that run is left running"),
    ],
)
def test_a_record_of_another_node_or_boot_is_refused(tmp_path: Path, bystander, host, boot, why) -> None:
    write_record(
        tmp_path / "run", {"trainer": {"pid": bystander.pid, "start_ticks": start_ticks(bystander.pid)}}, host, boot
    )
    r = subprocess.run(
        [sys.executable, "-m", "verl_patches.launch.cluster.stop", str(tmp_path / "run")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and why.format(host=socket.gethostname()) in r.stderr, r.stderr
    assert bystander.poll() is None


def test_record_problem_is_empty_for_this_node() -> None:
    here = PidRecord(socket.gethostname(), boot_id(), {})
    assert stop.record_problem(here, socket.gethostname(), boot_id()) == ""
    assert "run the stop on a" in stop.record_problem(PidRecord("a", "", {}), "b", "")


@pytest.mark.parametrize(
    "text, key",
    [
        ("[]", "key 'processes' missing"),
        ('{"processes": {}}', "keys 'host' and 'boot_id' must be strings"),
        ('{"host": "h", "boot_id": "b", "processes": {"x": 5}}', "key 'processes.x' must hold pid and start_ticks"),
        ('{"host": "h", "boot_id": "b", "processes": {"x": {"pid": true, "start_ticks": 1}}}', "'processes.x.pid'"),
        ('{"host": "h", "boot_id": "b", "processes": {"x": {"pid": 1, "start_ticks": 1}}}', "'processes.x.pid'"),
        (
            '{"host": "h", "boot_id": "b", "processes": {"x": {"pid": 9, "start_ticks": -1}}}',
            "'processes.x.start_ticks'",
        ),
        (
            '{"host": "h", "boot_id": "b", "processes": {"x": {"pid": 9, "start_ticks": "1"}}}',
            "'processes.x.start_ticks'",
        ),
        ('{"host": "h", "boot_id": "b", "processes": {"../x": {"pid": 9, "start_ticks": 1}}}', "process name"),
        ("{not json", "not JSON"),
    ],
)
def test_a_bad_record_is_refused_naming_the_key(text: str, key: str) -> None:
    with pytest.raises(PidRecordError) as e:
        parse_record(text, "RUN/pids.json")
    assert str(e.value).startswith("RUN/pids.json: ") and key in str(e.value)


def test_record_text_round_trips_and_drops_a_process_that_is_gone() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(30)
    record = parse_record(record_text({"launcher": os.getpid(), "trainer": gone.pid}), "pids.json")
    assert record.processes == {"launcher": ProcessId(os.getpid(), start_ticks(os.getpid()))}


def test_only_a_regular_file_of_yours_in_a_folder_of_yours_is_read(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_record(run, {})
    (tmp_path / "elsewhere.json").write_text((run / "pids.json").read_text())
    (run / "pids.json").unlink()
    (run / "pids.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(PidRecordError, match="cannot open"):
        read_record(run)
    with pytest.raises(PidRecordError, match="not a run folder"):
        read_record(tmp_path / "missing")
    if os.geteuid() == 0:  # only root can hand a folder to another account here
        other = tmp_path / "other"
        write_record(other, {})
        os.chown(other, 4242, -1)
        with pytest.raises(PidRecordError, match="owned by uid 4242, not by you"):
            read_record(other)
