"""The grading worker process: receive (job, pred, truth, soft limit), answer a verdict.

Started by `guarded_pool` as `python -m verl_patches.reward.grading_worker --in-fd R --out-fd W`,
i.e. a clean interpreter that never imports the trainer's `__main__` (multiprocessing's spawn and
forkserver would) and works from daemonic processes too.

A soft deadline (SIGALRM, fine here because this is the worker's main thread) stops most overruns
while keeping the worker alive; the parent's hard deadline kills the process for the rest (C-level
work that never returns to the interpreter). The address-space limit turns runaway allocations into
a MemoryError instead of letting one answer exhaust the node's memory.
"""

from __future__ import annotations

import argparse
import enum
import logging
import resource
import signal
from multiprocessing.connection import Connection

from verl_patches.reward.symbolic import symbolic_equal

READY = "ready"


class Verdict(str, enum.Enum):
    EQUAL = "equal"
    NOT_EQUAL = "not_equal"
    TIMEOUT = "timeout"
    ERROR = "error"


class _SoftDeadline(BaseException):
    """BaseException so that library code catching Exception cannot swallow the deadline."""


def _raise_soft_deadline(signum, frame):
    raise _SoftDeadline()


def _limit_memory(memory_limit_mb: int | None) -> None:
    if not memory_limit_mb:
        return
    limit = memory_limit_mb * 1024 * 1024
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def judge(pred: str, truth: str, soft_timeout_s: float) -> Verdict:
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, max(soft_timeout_s, 1e-3))
            equal = symbolic_equal(pred, truth)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return Verdict.EQUAL if equal else Verdict.NOT_EQUAL
    except _SoftDeadline:
        return Verdict.TIMEOUT
    except Exception:  # includes RecursionError and MemoryError (the address-space limit)
        return Verdict.ERROR


def serve(requests: Connection, responses: Connection, memory_limit_mb: int | None) -> None:
    """Answer requests until the parent closes the pipe or sends None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the trainer, which stops us
    signal.signal(signal.SIGALRM, _raise_soft_deadline)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    # Import sympy/math-verify, compile math-verify's regexes and load the sympy code that polynomials,
    # radicals and intervals need before reporting ready, so the first real judgements are not charged
    # for it (cold, each costs up to a second on a busy host).
    for pred, truth in (("1", "1"), ("(x+1)^2", "x^2+2x+1"), ("5", "2\\sqrt{3}"), ("[1,2]", "(1,2]")):
        symbolic_equal(pred, truth)
    _limit_memory(memory_limit_mb)
    responses.send(READY)
    while True:
        try:
            message = requests.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        job_id, pred, truth, soft_timeout_s = message
        responses.send((job_id, judge(pred, truth, soft_timeout_s).value))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Reward grading worker (started by verl_patches.reward.guarded_pool).")
    parser.add_argument("--in-fd", type=int, required=True, help="pipe to read requests from")
    parser.add_argument("--out-fd", type=int, required=True, help="pipe to write verdicts to")
    parser.add_argument("--memory-limit-mb", type=int, default=None, help="address-space limit of this process")
    args = parser.parse_args(argv)
    serve(Connection(args.in_fd, writable=False), Connection(args.out_fd, readable=False), args.memory_limit_mb)


if __name__ == "__main__":
    main()
