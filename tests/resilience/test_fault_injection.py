"""Fault injection for the restart tests: a rank kills (or stops) itself entering a phase of a step, once per run
folder, so a restarted trainer that runs the same step again with the same environment gets past it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from verl_patches.resilience import fault_injection, progress

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh_progress():
    progress.reset()
    yield
    progress.reset()


def enter(step: int, phase: str) -> None:
    progress.enter_call("update_actor", step, phase)


def test_kill_and_stop_are_parsed_alike_and_named_by_their_variable() -> None:
    assert fault_injection.parse("1:generate:5", fault_injection.INJECT_KILL_ENV) == fault_injection.FaultAt(
        1, "generate", 5, fault_injection.INJECT_KILL_ENV
    )
    with pytest.raises(ValueError, match=f"^{fault_injection.INJECT_KILL_ENV}='1:gen:5': phase 'gen'"):
        fault_injection.parse("1:gen:5", fault_injection.INJECT_KILL_ENV)


def test_each_injection_fires_once_per_run_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    sent: list[int] = []
    monkeypatch.setattr(fault_injection.os, "kill", lambda pid, sig: sent.append(sig))
    env = {
        fault_injection.INJECT_KILL_ENV: "2:update:3",
        fault_injection.INJECT_ENV: "2:ref:4",
        fault_injection.RUN_DIR_ENV: str(tmp_path),
    }
    armed = fault_injection.arm(2, env)
    assert [p.variable for p in armed] == [fault_injection.INJECT_ENV, fault_injection.INJECT_KILL_ENV]
    enter(3, "ref")
    enter(3, "update")
    assert sent == [signal.SIGKILL]
    assert (tmp_path / "fault-injected-kill-rank2-update-step3").is_file()
    # the restarted trainer: a new process arms the same variables and reaches the same step again
    progress.reset()
    fault_injection.arm(2, env)
    enter(3, "update")
    assert sent == [signal.SIGKILL]
    enter(4, "ref")
    assert sent == [signal.SIGKILL, signal.SIGSTOP]
    progress.reset()
    fault_injection.arm(2, env)
    enter(4, "ref")
    assert sent == [signal.SIGKILL, signal.SIGSTOP]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "fault-injected-kill-rank2-update-step3",
        "fault-injected-stop-rank2-ref-step4",
    ]


def test_without_a_run_folder_it_fires_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr(fault_injection.os, "kill", lambda pid, sig: sent.append(sig))
    env = {fault_injection.INJECT_KILL_ENV: "0:generate:1"}
    for _ in range(2):
        progress.reset()
        fault_injection.arm(0, env)
        enter(1, "generate")
    assert sent == [signal.SIGKILL, signal.SIGKILL]


def test_a_marker_that_cannot_be_made_still_injects(tmp_path: Path) -> None:
    plan = fault_injection.FaultAt(0, "update", 1, fault_injection.INJECT_KILL_ENV)
    assert fault_injection.first_time(plan, str(tmp_path / "missing"))  # no marker: it fires each time
    assert fault_injection.first_time(plan, str(tmp_path / "missing"))
    assert fault_injection.first_time(plan, str(tmp_path))
    assert not fault_injection.first_time(plan, str(tmp_path))  # marked above: a later one does not fire


PROCESS = """
import sys
from verl_patches.resilience import fault_injection, progress
fault_injection.arm(1, {"VERL_PATCHES_INJECT_KILL": "1:update:2", "VERL_PATCHES_RUN_DIR": sys.argv[1]},
                    before_stop=lambda: print("published", flush=True))
progress.enter_call("update_actor", 1, "update")
print("step 1 done", flush=True)
progress.enter_call("update_actor", 2, "update")
print("step 2 done", flush=True)
"""


def test_the_kill_ends_the_process_at_once_and_the_restarted_one_gets_past(tmp_path: Path) -> None:
    def run() -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-c", PROCESS, str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120
        )

    first = run()
    assert first.returncode == -signal.SIGKILL, first.stderr
    pid = first.stdout.split("pid ")[1].split(")")[0]
    assert first.stdout.splitlines() == [
        "step 1 done",
        f"verl_patches fault injection: rank 1 kills itself (SIGKILL, pid {pid}) entering phase 'update' of step 2 in "
        "update_actor",
        "published",
    ]
    second = run()
    assert second.returncode == 0 and second.stdout.splitlines() == ["step 1 done", "step 2 done"], second.stderr
