"""Run README command 1 (`train_deepseekv3_256die_random_init.sh --tiny`) from a test: to completion
(`run_tiny`), or as a job the test can kill like a cluster does (`TinyJob`).

A `TinyJob` starts the command in a session of its own and keeps track of every process of the job: the
processes below it, and every member of each process session one of them created (the launcher runs the
trainer in a new session; the trainer's local Ray cluster lives there). Killing the whole job SIGKILLs all of
them at once, as a cluster scheduler does; nothing outside the job is ever signalled.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from verl_patches.driver.run_metrics import STEP_LINE, parse_console

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "verl_patches/scripts/train_deepseekv3_256die_random_init.sh"
RESUME_PREFIX = "verl_patches resume:"
# verl's Megatron ActorRolloutRefWorker inside the fused group's colocated class: Ray names the process after it
WORKER_TITLES = ("ActorRolloutRefWorker", "WorkerDict")


def parse_steps(output: str) -> dict[int, dict[str, float]]:
    """The console logger's `step:N - key:value - ...` lines (values printed with 3 decimals)."""
    return parse_console(output)


def step_order(output: str) -> list[int]:
    """The steps in the order the job logged them (a step logged twice shows twice)."""
    return [int(m.group(1)) for m in STEP_LINE.finditer(output)]


def resume_lines(output: str) -> list[str]:
    return [line[line.index(RESUME_PREFIX) :] for line in output.splitlines() if RESUME_PREFIX in line]


def env_for_run() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RAY_ADDRESS", None)
    return env


def command(
    log_dir: Path,
    assets: Path,
    overrides: tuple[str, ...] = (),
    engine: str | None = None,
    launcher_flags: tuple[str, ...] = (),
) -> list[str]:
    flags = (["--tiny-engine", engine] if engine else []) + list(launcher_flags)
    return [
        "bash",
        SCRIPT,
        "--tiny",
        *flags,
        "--log-dir",
        str(log_dir),
        "--",
        f"overlay.tiny_assets_dir={assets}",
        *overrides,
    ]


@dataclass
class TinyRun:
    returncode: int
    output: str
    steps: dict[int, dict[str, float]]  # training steps (1, 2, ...), with the validations logged at them
    run_dir: Path | None
    validation_before_training: dict[str, float] | None = None  # logged at step 0 (the base model's)


def _run_dir(log_dir: Path) -> Path | None:
    dirs = sorted(log_dir.glob("tiny-*-local-*"))
    return dirs[-1] if dirs else None


def run_tiny(
    log_dir: Path, assets: Path, overrides: tuple[str, ...] = (), engine: str | None = None, timeout: int = 900
) -> TinyRun:
    proc = subprocess.run(
        command(log_dir, assets, overrides, engine),
        cwd=REPO,
        env=env_for_run(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    steps = parse_steps(out)
    return TinyRun(proc.returncode, out, {n: m for n, m in steps.items() if n >= 1}, _run_dir(log_dir), steps.get(0))


class TinyJob:
    """The tiny run as a background job whose output goes to ``<log_dir>/console.log``."""

    def __init__(
        self, log_dir: Path, assets: Path, overrides: tuple[str, ...], launcher_flags: tuple[str, ...] = ()
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self.console = log_dir / "console.log"
        self._out = open(self.console, "wb")
        self.proc = subprocess.Popen(
            command(log_dir, assets, overrides, launcher_flags=launcher_flags),
            cwd=REPO,
            env=env_for_run(),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.sessions = {self.proc.pid}  # the job's own session, and every session created inside it
        self.seen: dict[int, float] = {}  # pid -> create_time of every process ever seen in the job
        self.started = time.monotonic()

    # ---- watching ---------------------------------------------------------------------------------
    @property
    def output(self) -> str:
        self._out.flush()
        return self.console.read_text(errors="replace")

    @property
    def run_dir(self) -> Path | None:
        return _run_dir(self.log_dir)

    def members(self) -> list[psutil.Process]:
        """Every live process of the job: below its root, or in one of its sessions (orphans included)."""
        found: dict[int, psutil.Process] = {}
        try:
            root = psutil.Process(self.proc.pid)
            for p in [root, *root.children(recursive=True)]:
                found[p.pid] = p
        except psutil.NoSuchProcess:
            pass
        for p in list(found.values()):
            try:
                self.sessions.add(os.getsid(p.pid))
            except ProcessLookupError:
                pass
        for p in psutil.process_iter():
            try:
                if p.pid not in found and os.getsid(p.pid) in self.sessions:
                    found[p.pid] = p
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        live = []
        for p in found.values():
            try:
                created = p.create_time()
                if p.status() == psutil.STATUS_ZOMBIE:
                    continue
            except psutil.Error:
                continue
            if self.seen.setdefault(p.pid, created) == created:  # a recycled pid is not ours
                live.append(p)
        return live

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        """Block until the job's output matches ``pattern``; fails if the job ends or time runs out first."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout_s
        while True:
            self.members()  # keep the job's sessions known while it runs
            m = rx.search(self.output)
            if m:
                return m
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the job exited ({self.proc.returncode}) before {pattern!r}:\n{self.output[-6000:]}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {pattern!r} within {timeout_s:.0f} s:\n{self.output[-6000:]}")
            time.sleep(0.5)

    def wait(self, timeout_s: float) -> int:
        """The job's exit status; kills the job and fails if it runs longer than ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            self.members()
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"the job did not end within {timeout_s:.0f} s:\n{self.output[-6000:]}")
            time.sleep(0.5)
        self._out.flush()
        return self.proc.returncode

    # ---- killing ----------------------------------------------------------------------------------
    def workers(self) -> list[psutil.Process]:
        """The job's Ray worker processes of verl's ActorRolloutRefWorker (one per rank)."""
        out = []
        for p in self.members():
            try:
                title = " ".join(p.cmdline())
            except psutil.Error:
                continue
            if title.startswith("ray::") and any(t in title for t in WORKER_TITLES):
                out.append(p)
        return sorted(out, key=lambda p: p.pid)

    def kill_one_worker(self) -> str:
        workers = self.workers()
        if not workers:
            raise AssertionError(f"no ActorRolloutRefWorker process in the job: {self.describe()}")
        victim = workers[len(workers) // 2]
        title = " ".join(victim.cmdline())
        victim.send_signal(signal.SIGKILL)
        return f"pid {victim.pid} ({title}) of {len(workers)} workers"

    def kill(self) -> int:
        """SIGKILL every process of the job at once; returns how many were signalled."""
        killed = 0
        for _ in range(20):  # a process forked while we signal is caught on the next pass
            procs = self.members()
            if not procs:
                break
            for p in procs:
                try:
                    p.send_signal(signal.SIGKILL)
                    killed += 1
                except psutil.Error:
                    pass
            psutil.wait_procs(procs, timeout=5)
        if self.proc.poll() is None:
            self.proc.wait(10)
        self._out.flush()
        return killed

    def survivors(self, settle_s: float = 10.0) -> list[str]:
        """Processes of the job still alive after up to ``settle_s`` seconds (killed ones need reaping)."""
        deadline = time.monotonic() + settle_s
        while True:
            left = self.members()
            if not left or time.monotonic() > deadline:
                return [self._name(p) for p in left]
            time.sleep(0.5)

    def describe(self) -> str:
        return "; ".join(self._name(p) for p in self.members())

    @staticmethod
    def _name(p: psutil.Process) -> str:
        try:
            return f"{p.pid}: {' '.join(p.cmdline())[:120]}"
        except psutil.Error:
            return f"{p.pid}: (gone)"

    def close(self) -> None:
        if self.proc.poll() is None or self.members():
            self.kill()
        self._out.close()
