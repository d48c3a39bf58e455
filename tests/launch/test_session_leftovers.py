"""The launcher ends what its trainer's session left running, and nothing outside that session: the session
is named by its leader's identity (pid and start time), never by its id alone (issue 41, class 7)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from verl_patches.launch.session_leftovers import end_session_leftovers, session_members, wait_exited
from verl_patches.process_identity import ProcessId, start_ticks

# a child in its own session that starts a grandchild (same session) and exits at once; the grandchild
# ignores SIGTERM when asked to (a helper that does not stop when told)
CHILD = """
import subprocess, sys
code = (
    "import signal, time\\nif {ignore}: signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    "print('up', flush=True)\\ntime.sleep(120)"
)
p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
p.stdout.readline()
print(p.pid, flush=True)
"""


def _start(ignore_term: bool) -> tuple[subprocess.Popen, ProcessId, int]:
    """The child (exited, not reaped: as the launcher leaves its trainer until the cleanup is done), its
    identity recorded at its start, and the grandchild it left in its session."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(ignore=ignore_term)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    leader = ProcessId.of(child.pid)
    grandchild = int(child.stdout.readline())
    wait_exited(child.pid)
    return child, leader, grandchild


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_leftover_of_the_session_is_ended_and_named() -> None:
    for ignore_term in (False, True):
        child, leader, grandchild = _start(ignore_term)
        outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        lines: list[str] = []
        try:
            assert [p.pid for p in session_members(leader)] == [grandchild]
            start = time.monotonic()
            names = end_session_leftovers(leader, lines.append, grace_s=0.5, term_s=1.0)
            assert time.monotonic() - start < 10
            assert not _alive(grandchild), ignore_term  # SIGKILL after SIGTERM where SIGTERM is ignored
            assert len(names) == 1 and names[0].startswith(f"{grandchild} (")
            assert len(lines) == 1 and "ended 1 process(es) of the trainer's session" in lines[0]
            assert "still alive" not in lines[0]
            assert outsider.poll() is None  # another session is never touched
        finally:
            outsider.kill()
            outsider.wait()
            child.wait(30)
            if _alive(grandchild):
                psutil.Process(grandchild).kill()


def test_a_session_that_ended_by_itself_says_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    leader = ProcessId.of(child.pid)
    wait_exited(child.pid)
    lines: list[str] = []
    assert end_session_leftovers(leader, lines.append, grace_s=0.5) == [] and lines == []
    assert child.wait(30) == 0  # still the launcher's to reap


def test_a_leftover_that_exits_within_the_grace_is_not_signalled() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1)'])",
        ],
        start_new_session=True,
    )
    leader = ProcessId.of(child.pid)
    wait_exited(child.pid)
    lines: list[str] = []
    assert end_session_leftovers(leader, lines.append, grace_s=20) == [] and lines == []
    child.wait(30)


@pytest.mark.parametrize("how", ["start time differs", "leader reaped"])
def test_a_session_whose_leader_is_not_provably_ours_is_never_signalled(how: str) -> None:
    """A reused pid, simulated: a real session (leader exited, its member alive) named by a record whose start
    time is not the leader's (the number now belongs to another process), or whose leader was reaped (the
    number may be handed out again at any moment). Its member is neither chosen nor signalled."""
    child, leader, member = _start(ignore_term=False)
    try:
        if how == "start time differs":
            record = ProcessId(leader.pid, leader.started + 1)
        else:
            child.wait(30)
            record = leader
        assert start_ticks(member) is not None and os.getsid(member) == leader.pid  # the session is there
        lines: list[str] = []
        assert session_members(record) == []
        assert end_session_leftovers(record, lines.append, grace_s=0.2, term_s=0.5) == [] and lines == []
        assert _alive(member)
    finally:
        child.wait(30)
        os.kill(member, signal.SIGKILL)


def test_a_live_foreign_session_named_by_a_stale_record_is_untouched() -> None:
    """A record of a process that exited, whose pid now (simulated) belongs to the live leader of another
    session with a member: the record's start time is not that leader's, so nothing of it is signalled; the
    same session named by its true identity is found."""
    code = CHILD.format(ignore=False) + "import time; time.sleep(60)\n"  # the leader stays, with its member
    stranger = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        member = int(stranger.stdout.readline())
        real = ProcessId.of(stranger.pid)
        stale = ProcessId(stranger.pid, real.started - 1)
        lines: list[str] = []
        assert end_session_leftovers(stale, lines.append, grace_s=0.2, term_s=0.5) == [] and lines == []
        assert stranger.poll() is None and _alive(member)
        assert [p.pid for p in session_members(real)] == [member]
    finally:
        stranger.kill()
        stranger.wait()
        if _alive(member):
            os.kill(member, signal.SIGKILL)


LAUNCHER = """
import json, os, sys
from pathlib import Path
from types import SimpleNamespace
from verl_patches.launch import job, session_leftovers
session_leftovers.GRACE_S, session_leftovers.TERM_S = 0.5, 1.0
job.PIPE_DRAIN_S = 0.5
job.become_subreaper = lambda: False  # no adoption: the session, named by its leader, is all that finds it
out = Path(sys.argv[1])
launch = job.Launch(SimpleNamespace(tiny=True, profile="a3"),
                    SimpleNamespace(get=lambda k: str(out) if k == "LOG_DIR" else None), "local")
rc = job.run_logged([sys.executable, "-c", sys.argv[2]], launch.log_dir / "trainer.log", dict(os.environ), launch,
                    "trainer")
print(json.dumps({"rc": rc, "log": str(launch.log_dir)}), flush=True)
"""

TRAINER = """
import subprocess, sys
p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=subprocess.DEVNULL)
open(sys.argv[1], "w").write(str(p.pid))
sys.exit(3)
"""


def test_the_launcher_ends_its_trainers_session_named_by_the_leader_it_has_not_reaped(tmp_path) -> None:
    """run_logged waits for the trainer without reaping it, ends the trainer's session members (found while the
    unreaped trainer holds the session's id), then reaps it and returns its status."""
    repo = Path(__file__).resolve().parents[2]
    pidfile = tmp_path / "member.pid"
    trainer = TRAINER.replace("sys.argv[1]", repr(str(pidfile)))
    r = subprocess.run(
        [sys.executable, "-c", LAUNCHER, str(tmp_path / "logs"), trainer],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=str(repo)),
        cwd=repo,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    member = int(pidfile.read_text())
    try:
        report = json.loads(r.stdout.strip().splitlines()[-1])
        assert report["rc"] == 3 and not _alive(member)
        assert "ended 1 process(es) of the trainer's session" in r.stdout and f"{member} (" in r.stdout
    finally:
        if _alive(member):
            os.kill(member, signal.SIGKILL)
