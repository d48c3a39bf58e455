"""The launcher's restart loop: run the trainer, and after a failure diagnose it, decide, wait, run it again.

Thin on purpose: what failed is `failure_diagnosis`'s, whether and when to restart is `restart_policy`'s, and
what the trainer leaves behind is ended by the run itself (`job.run_logged`: the trainer's own session, with the
local Ray of the tiny run, and whatever left it), so nothing else is ever touched. Each run of the trainer is the
same command; it resumes from the last committed checkpoint by itself (`checkpoint.trainer_io.load_latest`). The
step a restart resumes from is read here through the same lookup the resume uses (`checkpoint.commit`).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from verl_patches.launch.failure_diagnosis import Cause, LostNode
from verl_patches.launch.restart_policy import DEFAULT_BACKOFF, Backoff, Failure, decide

INTERRUPTED_STATUS = 130
HEAD_BYTES = 1 << 20  # of a run's output, read from its start (its resume line) ...
TAIL_BYTES = 63 << 20  # ... and from its end (the hang report, the error): a cluster's trainer.log can be large


@dataclass(frozen=True)
class Run:
    """One run of the trainer, as the launcher saw it end."""

    returncode: int
    output: str  # what this run wrote (its part of trainer.log)
    pid: int
    stopped: bool = False  # the launcher passed on a stop request (Ctrl-C, launch.cluster.stop)


def wait(seconds: float) -> None:
    """The backoff's wait (a name of its own, so a test can shorten it without touching `time.sleep`). SIGTERM
    during it is a stop request, as Ctrl-C is (KeyboardInterrupt): the caller then stops what it started."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: no handler can be set here, and none is needed
        old = None
    try:
        time.sleep(seconds)
    finally:
        if old is not None:
            signal.signal(signal.SIGTERM, old)


def committed_step(root: Path, cluster: bool, environ: Mapping[str, str] | None = None) -> int:
    """The last committed checkpoint step under ``root`` (0: none): the step the trainer's resume would take
    (`commit.find_resume_and_why`, the resume's own lookup: a save still being written is not committed)."""
    # lazy: the checkpoint readers are needed only once a run failed
    from verl_patches.checkpoint.commit import find_resume_and_why

    point, _ = find_resume_and_why(root, cluster=cluster, environ=environ, say=lambda _line: None)
    return point.step if point is not None else 0


def dead_nodes(address: str, resource: str) -> list[LostNode]:
    """The nodes Ray's node table lists as dead (each with Ray's reason); [] when the table cannot be read."""
    # lazy: Ray (and the Ray node helpers) are imported only where this talks to Ray; the tiny run never does
    import ray

    # lazy, as Ray: the node helpers are needed only where this talks to Ray
    from verl_patches.launch.cluster.ray_cluster import node_rows

    try:
        rows = node_rows(address, resource)
    except Exception:  # noqa: BLE001 - the table only names a cause; a run is never held up for it
        return []
    finally:
        if ray.is_initialized():
            ray.shutdown()
    return [LostNode(r.label(), r.death) for r in rows if not r.alive]


def read_run_output(path: Path, start: int) -> str:
    """What a run wrote to ``path`` (the launch's own trainer.log) from offset ``start`` on: its first
    `HEAD_BYTES` and last `TAIL_BYTES` when it wrote more."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size - start <= HEAD_BYTES + TAIL_BYTES:
            f.seek(start)
            data = f.read()
        else:
            f.seek(start)
            data = f.read(HEAD_BYTES) + b"\n[...]\n"
            f.seek(size - TAIL_BYTES)
            data += f.read()
    return data.decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Outcome:
    returncode: int
    last_line: str = ""  # the policy's line after the last failure ('' when the trainer succeeded or restarts are off)


def supervise(
    run_trainer: Callable[[int], Run],
    diagnose: Callable[[Run], Cause],
    committed: Callable[[], int],
    max_restarts: int,
    say: Callable[[str], None],
    before_restart: Callable[[], None] = lambda: None,
    sleep: Callable[[float], None] | None = None,
    backoff: Backoff = DEFAULT_BACKOFF,
) -> Outcome:
    """Run the trainer (``run_trainer(n)``, n = 0 for the first run) until it succeeds or the policy stops: its
    last status (130 when a stop request came while waiting to restart) and the policy's last line.
    ``before_restart`` runs after the wait (the cluster launch waits for every node's NPUs again)."""
    history: list[Failure] = []
    n = 0
    while True:
        run = run_trainer(n)
        if run.returncode == 0 or max_restarts <= 0:
            return Outcome(run.returncode)
        cause = diagnose(run)
        unusable = ""
        try:
            step = committed()
        except Exception as e:  # noqa: BLE001 - any refusal of the checkpoint folder ends the restarts, named
            step, unusable = 0, f"the checkpoint folder cannot be read to resume ({type(e).__name__}: {e})"
        history.append(Failure(cause.what, cause.step, step, cause.not_restartable or unusable))
        decision = decide(history, max_restarts, backoff)
        say(decision.line)
        if not decision.restart:
            return Outcome(run.returncode, decision.line)
        try:
            (sleep or wait)(decision.delay_s)
            before_restart()
        except KeyboardInterrupt:
            line = f"stopped while waiting to restart: no restart (the trainer's last status was {run.returncode})"
            say(line)
            return Outcome(INTERRUPTED_STATUS, line)
        n += 1
