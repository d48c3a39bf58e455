"""The launcher ends what its trainer's session left running, and nothing outside that session."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from verl_patches.launch.session_leftovers import end_session_leftovers, session_members

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


def _start(ignore_term: bool) -> tuple[subprocess.Popen, int]:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(ignore=ignore_term)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    grandchild = int(child.stdout.readline())
    child.wait(30)
    return child, grandchild


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_leftover_of_the_session_is_ended_and_named() -> None:
    for ignore_term in (False, True):
        child, grandchild = _start(ignore_term)
        outsider = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        lines: list[str] = []
        try:
            assert [p.pid for p in session_members(child.pid)] == [grandchild]
            start = time.monotonic()
            names = end_session_leftovers(child.pid, lines.append, grace_s=0.5, term_s=1.0)
            assert time.monotonic() - start < 10
            assert not _alive(grandchild), ignore_term  # SIGKILL after SIGTERM where SIGTERM is ignored
            assert len(names) == 1 and names[0].startswith(f"{grandchild} (")
            assert len(lines) == 1 and "ended 1 process(es) of the trainer's session" in lines[0]
            assert "still alive" not in lines[0]
            assert outsider.poll() is None  # another session is never touched
        finally:
            outsider.kill()
            outsider.wait()
            if _alive(grandchild):
                psutil.Process(grandchild).kill()


def test_a_session_that_ended_by_itself_says_nothing() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    child.wait(30)
    lines: list[str] = []
    assert end_session_leftovers(child.pid, lines.append, grace_s=0.5) == [] and lines == []


def test_a_leftover_that_exits_within_the_grace_is_not_signalled() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1)'])",
        ],
        start_new_session=True,
    )
    child.wait(30)
    lines: list[str] = []
    assert end_session_leftovers(child.pid, lines.append, grace_s=20) == [] and lines == []
