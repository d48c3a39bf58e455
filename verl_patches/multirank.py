"""Run a function (or a script) on N ranks of this host: the one multi-rank harness of the checks, the
benchmarks and the tests.

Each rank is a fresh (spawned) process with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR=127.0.0.1 and MASTER_PORT set; it runs ``target(rank, world, **kwargs)`` and hands its JSON-able
result back through a file in the run's private folder. What a caller can count on:

* one deadline for all ranks together, from the start of the run: never a time-out per rank in turn, which
  lets N hung ranks take N time-outs;
* a rank still running at the deadline prints its Python stacks (every thread: faulthandler on SIGUSR1), and
  the parent prints them with the rank number before it kills the ranks it started, so the error says where
  a rank hung, not only that it did;
* a rank that raised is named with its traceback; one that died without a result, with its exit status and
  the end of its output; its peers (most likely waiting for it in a collective) then get `PEER_GRACE_S` to
  end on their own before they count as hung;
* no rank it started is left running once it returns or raises;
* the teardown rule, applied in this module only (`_rank_main`, `_script_rank_main`): a rank ends through
  `exit_rank` once its result is written, never through ``destroy_process_group`` (`verl_patches.base.rank_exit`
  says why), and rank 0, which serves the group's store, ends last (`_leave_group`).

A rank's stdout and stderr go to ``rank{r}.log`` in the run's folder (Megatron and vLLM are verbose); the end
of a failing rank's log is part of the error.

`run_rank_scripts` is the same harness for ranks that are a script (or a module) run with its own argv and
environment, as a launcher starts them: the same supervision (`_supervise`: deadline, stacks, kill, error),
the same log file; each rank starts through a bootstrap (`_script_rank_main`) that sets up its stack dump
first and ends it by the teardown rule once the script returns, and its report is its exit status.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import pickle
import runpy
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing import get_context
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any, NoReturn, Protocol

from verl_patches.base.free_port import free_port
from verl_patches.base.rank_exit import exit_rank

STACK_SIGNAL = signal.SIGUSR1
PEER_GRACE_S = 10.0  # after one rank failed: how long its peers get to finish or fail on their own
STACKS_WAIT_S = 3.0  # how long a signalled rank gets to write its stacks before it is killed
LINGER_S = 2.0  # how long a rank that reported gets to end on its own before it is killed
POLL_S = 0.2  # how often the parent looks for reports while no rank ends
DONE_KEY = "multirank/reported"  # in the group's store: how many ranks have written their report
LOG_TAIL_LINES = 30
STOPPED = "stopped: the caller's stop condition held"  # RankRun.killed of the ranks `stop` ended
# A script rank's first code: imports this module from the folder verl_patches is in (appended: the script's own
# path comes first) and hands it the rest of its argv. Script and arguments travel as argv, never as code text.
_SCRIPT_BOOTSTRAP = (
    "import sys; sys.path.append(sys.argv[1]); "
    "from verl_patches.multirank import _script_rank_main; _script_rank_main(sys.argv[2:])"
)

_stacks_file = None  # the file faulthandler writes this rank's stacks to: open for the rank's whole life


class RankFailure(RuntimeError):
    """Ranks raised, died without a result, or were still running at the deadline (the message says which)."""

    def __init__(self, message: str, ranks: Sequence[int] = (), hung: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.ranks = list(ranks)  # every rank at fault, in rank order
        self.hung = list(hung)  # those of them that were still running and were killed


@dataclass(frozen=True)
class RankRun:
    """A rank of `run_rank_scripts`, once it ended."""

    status: int  # its exit status; negative: the signal that ended it
    output: str  # its stdout and stderr, together
    killed: str = ""  # why this harness ended it ('' when it ended on its own): the reason the wait stopped, or STOPPED


def run_ranks(
    target: Callable[..., Any],
    world: int,
    timeout_s: float,
    *,
    kwargs: Mapping[str, Any] | None = None,
    backend: str | None = "gloo",
    group_timeout_s: float | None = None,
    preload: Sequence[str] = (),
    setup: Callable[[int, int], None] | None = None,
    rank_env: Sequence[Mapping[str, str | None]] | None = None,
) -> list[Any]:
    """Run ``target(rank, world, **kwargs)`` on `world` ranks; return each rank's result, in rank order.

    `target`, `setup` and `kwargs` cross to the ranks by pickling (module-level functions, ``functools.partial``).
    Each rank, in order: its environment (`rank_env[rank]` last: a value of None unsets the variable), one torch
    thread (the ranks share this host's cores), the modules named in `preload` imported in order (the caller's:
    ``verl_patches.prelude_patch`` for the overlay, as a Ray worker of the job has it; this harness knows none of
    them), ``setup(rank, world)`` (e.g. its device, before the group binds it), the
    process group over ``tcp://127.0.0.1`` with `backend` (None: the target makes its own, if any) and a
    collective time-out of `group_timeout_s` (default 0.8 x `timeout_s`), then the target.
    Raises `RankFailure` naming each failed rank, after every rank it started has ended.
    """
    _check_world(world, rank_env)
    # Pickled here and unpickled in the rank only after its environment is in place: the target's module may read
    # it at import. Bytes this process made, never read from a file.
    payload = pickle.dumps((target, setup, dict(kwargs or {})))
    group_timeout = group_timeout_s if group_timeout_s is not None else 0.8 * timeout_s
    ctx = get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="multirank_") as run_dir:

        def start(r: int) -> _FunctionRank:
            env = dict(rank_env[r]) if rank_env is not None else {}
            args = (r, world, port, run_dir, env, backend, group_timeout, tuple(preload), payload)
            proc = ctx.Process(target=_rank_main, args=args, name=f"rank{r}")
            proc.start()
            return _FunctionRank(proc, run_dir, r)

        ranks, outcome = _supervise(start, world, timeout_s, run_dir, PEER_GRACE_S, None)
        _raise_if_failed(outcome, ranks, run_dir, check=True)
        return [outcome.reports[r]["ok"] for r in range(world)]


def run_rank_scripts(
    script: str | os.PathLike[str],
    world: int,
    timeout_s: float,
    *,
    args: Sequence[str] | Callable[[int], Sequence[str]] = (),
    module: bool = False,
    rank_env: Sequence[Mapping[str, str | None]] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    check: bool = True,
    peer_grace_s: float | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[RankRun]:
    """Run `script` (a Python file; with `module`, a module name, as ``python -m`` runs it) as `world` ranks,
    each with its arguments (`args`, or ``args(rank)``); return each rank's `RankRun`, in rank order.

    Each rank's environment: this process's, then RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
    MASTER_ADDR=127.0.0.1 and a free MASTER_PORT, then `rank_env[rank]` (a value of None unsets the variable).
    The script makes its own process group, if any; it ends as the teardown rule says once it returns (or
    raises, or calls ``sys.exit``), skipping interpreter teardown. A rank succeeds when it exits with status 0.

    One deadline for all ranks, hung ranks' stacks printed, what was started killed, as in `run_ranks`. Once a
    rank failed, its peers get `peer_grace_s` (default `PEER_GRACE_S`; 0: none, as a cluster takes a job
    down when one of its workers dies) before they count as hung. `stop`, polled while ranks run, ends every
    rank still running at once when it returns True (a whole job killed from outside; no stacks: not a hang).
    With `check` (the default) any failed rank raises `RankFailure`; without it, a rank's failure, and the
    ranks killed after it or by `stop`, are returned (for tests that kill ranks on purpose), and only ranks
    still running at the deadline raise.
    """
    _check_world(world, rank_env)
    args_of = args if callable(args) else (lambda _rank: args)
    port = free_port()
    home = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder verl_patches is in
    with tempfile.TemporaryDirectory(prefix="multirank_") as run_dir:

        def start(r: int) -> _ScriptRank:
            env = dict(os.environ)
            env.update(_rank_variables(r, world, port))
            _override(env, rank_env[r] if rank_env is not None else {})
            mode = "module" if module else "path"
            stacks = os.path.join(run_dir, f"rank{r}.stacks")
            argv = [sys.executable, "-c", _SCRIPT_BOOTSTRAP, home, stacks, mode, os.fspath(script)]
            argv += [str(a) for a in args_of(r)]
            with open(os.path.join(run_dir, f"rank{r}.log"), "wb") as log:
                popen = subprocess.Popen(
                    argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            return _ScriptRank(popen)

        grace = PEER_GRACE_S if peer_grace_s is None else peer_grace_s
        ranks, outcome = _supervise(start, world, timeout_s, run_dir, grace, stop)
        _raise_if_failed(outcome, ranks, run_dir, check)
        runs = []
        for r, rank in enumerate(ranks):
            killed = outcome.why if r in outcome.hung else STOPPED if r in outcome.stopped else ""
            output = _read_text(os.path.join(run_dir, f"rank{r}.log"))
            runs.append(RankRun(rank.status(), output, killed))
        return runs


def _check_world(world: int, rank_env: Sequence[Mapping[str, str | None]] | None) -> None:
    if world < 1:
        raise ValueError(f"world must be at least 1, not {world}")
    if rank_env is not None and len(rank_env) != world:
        raise ValueError(f"rank_env has {len(rank_env)} entries for {world} ranks")


def _rank_variables(rank: int, world: int, port: int) -> dict[str, str]:
    """What every rank of a run on this host is told of itself and of its group's rendezvous."""
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def _override(env: MutableMapping[str, str], changes: Mapping[str, str | None]) -> None:
    """Apply a caller's per-rank changes: a value of None unsets the variable."""
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


# ---- one rank as the supervision sees it ---------------------------------------------------------------------


class _Rank(Protocol):
    pid: int
    sentinel: int | None  # a handle `multiprocessing.connection.wait` wakes on when the rank ends; None: poll

    def report(self) -> dict | None:
        """None while running; then {"ok": value} | {"error": traceback} | {"died": status} | {"exited": status}."""

    def alive(self) -> bool: ...

    def kill(self) -> None: ...

    def status(self) -> int:
        """Wait for the rank's end; its exit status (negative: the signal that ended it)."""


class _FunctionRank:
    """A rank of `run_ranks`: a spawned process that reports through files in the run's folder."""

    def __init__(self, proc: BaseProcess, run_dir: str, rank: int) -> None:
        self.proc, self.run_dir, self.rank = proc, run_dir, rank
        self.pid, self.sentinel = proc.pid, proc.sentinel

    def report(self) -> dict | None:
        exitcode = self.proc.exitcode  # before the marker: a rank that reports and then ends is read either way
        if os.path.exists(_done_marker(self.run_dir, self.rank)):
            with open(os.path.join(self.run_dir, f"rank{self.rank}.json")) as f:
                return json.load(f)
        return None if exitcode is None else {"died": exitcode}  # ended without a complete report

    def alive(self) -> bool:
        return self.proc.is_alive()

    def kill(self) -> None:
        self.proc.kill()

    def status(self) -> int:
        self.proc.join()
        return self.proc.exitcode


class _ScriptRank:
    """A rank of `run_rank_scripts`: its report is its exit status."""

    sentinel = None  # a Popen has nothing to wait on: the supervision polls it every POLL_S

    def __init__(self, popen: subprocess.Popen) -> None:
        self.popen, self.pid = popen, popen.pid

    def report(self) -> dict | None:
        code = self.popen.poll()
        if code is None:
            return None
        return {"ok": code} if code == 0 else {"exited": code}

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        self.popen.kill()

    def status(self) -> int:
        return self.popen.wait()


def _done_marker(run_dir: str, rank: int) -> str:
    """Made by the rank once its report is written and closed: the parent never reads half a report."""
    return os.path.join(run_dir, f"rank{rank}.done")


# ---- the supervision both entries share: one deadline, stacks, kill, error ------------------------------------


@dataclass
class _Outcome:
    reports: dict[int, dict]  # each rank that reported, by rank (`_Rank.report`)
    hung: list[int]  # still running when the wait stopped: their stacks were collected, then they were killed
    stopped: list[int]  # still running when the caller's `stop` held: killed without stacks (not a hang)
    why: str  # what stopped the wait for the hung ranks
    at_deadline: bool  # the wait ran out at the run's deadline (not at a grace after a failure)
    stacks: dict[int, str] = field(default_factory=dict)

    def failed(self) -> list[int]:
        bad = {r for r, res in self.reports.items() if "ok" not in res}
        return sorted(bad | set(self.hung) | set(self.stopped))

    def clean(self) -> bool:
        """Every rank reported, none died: the ones still on their way out may end on their own."""
        return not self.hung and not self.stopped and all("died" not in r for r in self.reports.values())


def _supervise(
    start: Callable[[int], _Rank],
    world: int,
    timeout_s: float,
    run_dir: str,
    peer_grace_s: float,
    stop: Callable[[], bool] | None,
) -> tuple[list[_Rank], _Outcome]:
    """Start ranks 0..world-1 with `start` and see every one of them end: the outcome, once none is running."""
    deadline = time.monotonic() + timeout_s  # counted from before the first rank starts: their start-up included
    ranks: list[_Rank] = []
    outcome = None
    try:
        for r in range(world):
            ranks.append(start(r))  # only once started: the cleanup below ends every rank listed
        outcome = _wait(ranks, deadline, timeout_s, peer_grace_s, stop)
        outcome.stacks = _collect_stacks(ranks, outcome.hung, run_dir)
    finally:
        # rank 0 of `run_ranks` keeps the group's store until every rank has reported: worth a wait only then
        _end(ranks, linger=outcome is not None and outcome.clean())
    return ranks, outcome


def _wait(
    ranks: list[_Rank], deadline: float, timeout_s: float, peer_grace_s: float, stop: Callable[[], bool] | None
) -> _Outcome:
    """Each rank's report; the ranks that had none when the wait stopped, and why it stopped."""
    reports: dict[int, dict] = {}
    limit, why = deadline, f"the deadline ({timeout_s:g} s for all {len(ranks)} ranks together)"
    while True:
        for r, rank in enumerate(ranks):
            report = None if r in reports else rank.report()
            if report is None:
                continue
            reports[r] = report
            if "ok" not in report and limit == deadline and time.monotonic() + peer_grace_s < deadline:
                limit = time.monotonic() + peer_grace_s
                why = f"{peer_grace_s:g} s after rank {r} failed"
        running = [r for r in range(len(ranks)) if r not in reports]
        if running and stop is not None and stop():
            return _Outcome(reports, [], running, STOPPED, at_deadline=False)
        left = limit - time.monotonic()
        if not running or left <= 0:
            return _Outcome(reports, running, [], why, at_deadline=limit == deadline)
        _pause([ranks[r] for r in running], left)  # a report may come as a file, not an exit: never wait long


def _pause(ranks: list[_Rank], seconds: float) -> None:
    """Up to POLL_S (or `seconds`, if less); less when one of `ranks` that has a sentinel ends."""
    seconds = max(min(seconds, POLL_S), 0.0)
    sentinels = [rank.sentinel for rank in ranks if rank.sentinel is not None]
    if sentinels:
        wait(sentinels, timeout=seconds)
    else:
        time.sleep(seconds)


def _end(ranks: list[_Rank], linger: bool) -> None:
    """No rank left running: with `linger`, the ranks still on their way out get `LINGER_S` to end on their own;
    then every rank still running is killed."""
    until = time.monotonic() + (LINGER_S if linger else 0.0)
    while time.monotonic() < until and any(rank.alive() for rank in ranks):
        _pause([rank for rank in ranks if rank.alive()], until - time.monotonic())
    for rank in ranks:
        if rank.alive():
            rank.kill()
        rank.status()


def _collect_stacks(ranks: list[_Rank], hung: list[int], run_dir: str) -> dict[int, str]:
    """Signal each hung rank to write its stacks, give them `STACKS_WAIT_S`, print what they wrote."""
    for r in hung:
        try:
            os.kill(ranks[r].pid, STACK_SIGNAL)
        except ProcessLookupError:
            pass
    paths = {r: os.path.join(run_dir, f"rank{r}.stacks") for r in hung}
    sizes: dict[int, int] = {}
    until = time.monotonic() + STACKS_WAIT_S
    while hung and time.monotonic() < until:
        time.sleep(0.2)
        now = {r: _size(path) for r, path in paths.items()}
        if all(now.values()) and now == sizes:  # every rank wrote, and nothing more came in 0.2 s
            break
        sizes = now
    stacks = {}
    for r in hung:
        text = _read_text(paths[r]).strip() or "(none: the rank had not yet set up its stack dump, or died first)"
        stacks[r] = text
        print(f"--- multirank: rank {r} (pid {ranks[r].pid}) still running, its stacks ---\n{text}", file=sys.stderr)
    sys.stderr.flush()
    return stacks


def _raise_if_failed(outcome: _Outcome, ranks: list[_Rank], run_dir: str, check: bool) -> None:
    """With `check`, any failed rank raises; without, only ranks still running at the run's deadline do."""
    failed = outcome.failed()
    if failed and (check or (outcome.hung and outcome.at_deadline)):
        raise RankFailure(_failure_message(outcome, ranks, run_dir), failed, outcome.hung)


def _failure_message(outcome: _Outcome, ranks: list[_Rank], run_dir: str) -> str:
    summary, details = [], []
    for r, rank in enumerate(ranks):
        res = outcome.reports.get(r, {})
        if "error" in res:
            last = res["error"].strip().splitlines()[-1] if res["error"].strip() else "an exception"
            summary.append(f"rank {r} raised ({last})")
            details.append(f"--- rank {r} raised ---\n{res['error'].rstrip()}")
        elif "died" in res or "exited" in res:
            ended = _ended(res["died"]) + " and no result" if "died" in res else _ended(res["exited"])
            summary.append(f"rank {r} {ended}")
            details.append(f"--- rank {r} {ended}; its output ends ---\n{_tail(run_dir, r)}")
        elif r in outcome.hung:
            summary.append(f"rank {r} was still running at {outcome.why}")
            details.append(
                f"--- rank {r} (pid {rank.pid}) still running at {outcome.why}: its stacks ---\n"
                f"{outcome.stacks[r]}\n--- rank {r}'s output ends ---\n{_tail(run_dir, r)}"
            )
        elif r in outcome.stopped:
            summary.append(f"rank {r} was {STOPPED}")
            details.append(f"--- rank {r} was {STOPPED}; its output ends ---\n{_tail(run_dir, r)}")
    return f"{len(summary)} of {len(ranks)} ranks failed: " + "; ".join(summary) + "\n" + "\n".join(details)


def _ended(status: int) -> str:
    if status >= 0:
        return f"exited with status {status}"
    try:
        return f"was ended by {signal.Signals(-status).name}"
    except ValueError:
        return f"was ended by signal {-status}"


def _tail(run_dir: str, rank: int) -> str:
    lines = _read_text(os.path.join(run_dir, f"rank{rank}.log")).splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:]) if lines else "(no output)"


def _read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _rank_main(
    rank: int,
    world: int,
    port: int,
    run_dir: str,
    env: dict[str, str | None],
    backend: str | None,
    group_timeout_s: float,
    preload: tuple[str, ...],
    payload: bytes,
) -> None:
    """One rank. The stack dump is set up first, before the target's modules are imported (an import can
    hang too); the result file is written last, then the rank exits without tearing its group down."""
    global _stacks_file
    parent, store = os.getppid(), None
    os.environ.update(_rank_variables(rank, world, port))
    _override(os.environ, env)
    log = os.open(os.path.join(run_dir, f"rank{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    _stacks_file = open(os.path.join(run_dir, f"rank{rank}.stacks"), "w")
    faulthandler.register(STACK_SIGNAL, file=_stacks_file, all_threads=True)
    try:
        target, setup, kwargs = pickle.loads(payload)
        # torch only here, in the rank: the parent (check_logprobs' CLI, a benchmark's report) needs none of it
        import torch

        torch.set_num_threads(1)
        for name in preload:  # the caller's modules (the overlay, say), each imported as its own rank's would be
            importlib.import_module(name)
        if setup is not None:
            setup(rank, world)
        if backend is not None:
            import torch.distributed as dist  # as torch above: the rank's import, not the parent's

            timeout = timedelta(seconds=group_timeout_s)
            store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timeout)  # served by rank 0
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        report = json.dumps({"ok": target(rank, world, **kwargs)})
    except BaseException:
        report = json.dumps({"error": traceback.format_exc()})
    with open(os.path.join(run_dir, f"rank{rank}.json"), "w") as f:
        f.write(report)
    open(_done_marker(run_dir, rank), "x").close()
    if store is not None:
        _leave_group(store, rank, world, group_timeout_s, parent)
    exit_rank(0)  # the result is in the file; no process-group teardown (verl_patches.base.rank_exit says why)


def _leave_group(store: Any, rank: int, world: int, timeout_s: float, parent: int) -> None:
    """Rank 0 serves the group's store: it stays until every rank has reported, so that a peer still setting up a
    group (``init_process_group``, ``new_group``) never loses the store under it; the others leave at once. Rank 0
    gives up after the group's time-out or when the parent is gone, never lingering as an orphan."""
    try:
        store.add(DONE_KEY, 1)
        until = time.monotonic() + timeout_s
        while rank == 0 and store.add(DONE_KEY, 0) < world and time.monotonic() < until and os.getppid() == parent:
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - the report is written; a store gone with a peer changes nothing for it
        pass


def _script_rank_main(argv: list[str]) -> NoReturn:
    """A rank of `run_rank_scripts`, in the child (`_SCRIPT_BOOTSTRAP`; argv: stacks file, "path" | "module",
    script, its arguments). The stack dump is set up before the script runs; the script runs as ``python SCRIPT
    ARGS`` (or ``python -m MODULE ARGS``) would run it; then the rank ends through `exit_rank` with the script's
    status, skipping interpreter teardown (``verl_patches.base.rank_exit`` says why): the teardown rule, here."""
    global _stacks_file
    stacks, mode, target, *args = argv
    _stacks_file = open(stacks, "w")
    faulthandler.register(STACK_SIGNAL, file=_stacks_file, all_threads=True)
    sys.argv = [target, *args]
    try:
        if mode == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(target))  # where `python SCRIPT` looks first
            runpy.run_path(target, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback on stderr, status 1
        traceback.print_exc()
        status = 1
    exit_rank(status)


def _exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process: None is 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
