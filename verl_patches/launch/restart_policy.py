"""Whether the launcher restarts the trainer after a failure, after how long, and the one line that says so (pure).

The input is the run's history of failures, each as the launcher saw it once the trainer had exited: what failed
(`Failure.what`, from `failure_diagnosis`), the step it failed in when known, and the last committed checkpoint
step read right after it (the step a restart resumes from). The rules, in this order:

1. a failure a restart cannot fix (the user stopped the run, the trainer refused its config) is never restarted;
2. ``--max-restarts N`` restarts in all, counted over the whole launch (N = 0: the trainer's failure ends the
   launch, as before restarts existed);
3. the same step failing twice ends the restarts: two failures in a row with no newer committed checkpoint in
   between, the second no further than the first (when both steps are known; an unknown step counts as the same).
   Such a fault comes back at the same place: the next restart would fail there again, and each costs a start-up;
4. otherwise restart after an exponential backoff: `Backoff.first_s` doubling per restart, at most `Backoff.cap_s`
   (10, 20, 40, ... 300 s): the time a device, an HCCL link or a node needs to come back is unknown, and a fault
   that repeats within seconds should not turn into a tight loop of start-ups.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_A3_RESTARTS = 3  # the cluster launch's default: see docs/a3-cluster-guide.md, "Restarts without a person"
FIRST_DELAY_S = 10.0
MAX_DELAY_S = 300.0
STOPPED_PREFIX = "stopped restarting:"


@dataclass(frozen=True)
class Backoff:
    first_s: float = FIRST_DELAY_S
    cap_s: float = MAX_DELAY_S

    def delay(self, restart: int) -> float:
        """The wait before restart number ``restart`` (1-based)."""
        if restart < 1:
            raise ValueError(f"restart number must be at least 1, got {restart}")
        return min(self.cap_s, self.first_s * 2.0 ** min(restart - 1, 62))


@dataclass(frozen=True)
class Failure:
    """One failed run of the trainer."""

    what: str  # one phrase naming the cause, the node and the step: "a hang of rank 2 (node X, pid P) in ..."
    step: int | None  # the step it failed in; None when unknown (or before its first step)
    committed: int  # the last committed checkpoint step after the failure (0: none)
    not_restartable: str = ""  # why a restart cannot help ('' when it can)


@dataclass(frozen=True)
class Decision:
    restart: bool
    line: str  # the launcher's one line about it ('' when restarts are off)
    delay_s: float = 0.0
    number: int = 0  # the restart's number (1-based) when restarting


def same_step_failed_twice(before: Failure, after: Failure) -> bool:
    """No progress between two failures in a row: no newer committed checkpoint, and the second failure no
    further than the first (an unknown step counts as the same place)."""
    if after.committed > before.committed:
        return False
    if before.step is None or after.step is None:
        return True
    return after.step <= before.step


def failed_step(f: Failure) -> int:
    """The step named as having failed: the one it failed in, else the one after its committed checkpoint."""
    return f.step if f.step is not None else f.committed + 1


DEFAULT_BACKOFF = Backoff()


def decide(history: Sequence[Failure], max_restarts: int, backoff: Backoff = DEFAULT_BACKOFF) -> Decision:
    """After the last failure of ``history`` (every failure of this launch, oldest first): restart or stop."""
    if not history:
        raise ValueError("decide: no failure to decide on")
    if max_restarts < 0:
        raise ValueError(f"--max-restarts must be 0 or more, got {max_restarts}")
    last = history[-1]
    made = len(history) - 1  # restarts already made: one per earlier failure
    if max_restarts == 0:
        return Decision(False, "")
    if last.not_restartable:
        return Decision(False, f"not restarting after {last.what}: {last.not_restartable}")
    if made >= max_restarts:
        return Decision(
            False,
            f"{STOPPED_PREFIX} {made} restart{'s' if made != 1 else ''} made, the most --max-restarts "
            f"{max_restarts} allows; last failure: {last.what}",
        )
    if len(history) >= 2 and same_step_failed_twice(history[-2], last):
        return Decision(
            False,
            f"{STOPPED_PREFIX} step {failed_step(last)} failed twice (no checkpoint newer than step "
            f"{last.committed} was committed between the two failures, so a restart would meet it again); "
            f"last failure: {last.what}",
        )
    number = made + 1
    delay = backoff.delay(number)
    return Decision(
        True,
        f"restart {number}/{max_restarts} after {last.what}; resuming from step {last.committed} in {delay:g} s",
        delay,
        number,
    )


def checkpoint_problem(save_freq: object, resume_mode: object, folder: object = "set") -> str:
    """'' when a restart resumes where the run failed; else why it would not, and the key to change (one line).
    ``folder``: the checkpoint root (`trainer.default_local_dir`), empty or None when the config has none."""
    if not folder:
        return "trainer.default_local_dir is not set (CKPT_DIR on the cluster), so no restart could resume"
    try:
        freq = int(save_freq)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return f"trainer.save_freq={save_freq!r} is not a number of steps"
    if freq <= 0:
        return (
            f"trainer.save_freq={freq} writes no checkpoint, so a restart would start over from step 0 "
            "(set trainer.save_freq > 0)"
        )
    mode = "auto" if resume_mode is None else str(resume_mode)
    if mode != "auto":
        return (
            f"trainer.resume_mode={mode}: a restart would "
            + ("start over from step 0" if mode == "disable" else "resume from that fixed path again")
            + ", not from the last committed step (set trainer.resume_mode=auto)"
        )
    return ""


@dataclass(frozen=True)
class RestartSetting:
    restarts: int  # how many restarts this launch may make
    refusal: str = ""  # the launch refuses to start: one line
    note: str = ""  # a line for the launcher's log (restarts turned off, and why)


def restart_setting(
    asked: int | None, default: int, save_freq: object, resume_mode: object, folder: object = "set"
) -> RestartSetting:
    """``--max-restarts`` (``asked``; None: not given, ``default`` applies) against the run's checkpoints: a restart
    without them would start over, so an explicit request is refused and the default turned off with a note."""
    wanted = default if asked is None else asked
    if wanted <= 0:
        return RestartSetting(0)
    problem = checkpoint_problem(save_freq, resume_mode, folder)
    if not problem:
        return RestartSetting(wanted)
    if asked is not None:
        return RestartSetting(0, refusal=f"--max-restarts {asked}: {problem}, or give --max-restarts 0")
    return RestartSetting(0, note=f"restarts off (the default --max-restarts {default} needs checkpoints): {problem}")
