"""What ended a run of the trainer, in one phrase that names the cause, the node and the step (pure).

Read, in this order, from what the launcher has once the trainer exited: whether the user stopped it; the
driver's hang report in this run's output (`resilience.hang_diagnosis`: a frozen, stuck or dead rank with its
node, pid, phase and step); the nodes Ray marked dead during the run (the cluster launch reads Ray's node table);
an HCCL error in the output (torch_npu's and CANN's words for it); the trainer's own exit (killed by a signal, a
refusal, an error). The step is the report's, else the one after the last step this run logged, else the one
after the step it resumed from.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from verl_patches.resilience.hang_diagnosis import last_report

REFUSED_STATUS = 2  # the trainer entry's refusal of its config or input: the same on every restart

_WHO = re.compile(r"rank (\d+) \(node ([^,()]*?),? *pid (\d+)\)")
_WHERE = re.compile(r"phase '(\w+)'(?: \([^)]*\))? of step (\d+|\?)")
_REPORT_STEP = re.compile(r"^\S+ \S+ (\S+) \(step (\d+|\?)\)")
_SAME_PLACE = re.compile(r"no rank is behind another: ranks (\S+) are all alive and stopped in phase '(\w+)'")
_NEVER = re.compile(r"(worker \d+ of the group[^;]*?) never reported a heartbeat")
_RESUMED = r" (?:from \S+ \(step (\d+)|starting from step (\d+))"  # after trainer_io.RESUME_PREFIX
# torch_npu 2.5.1's and CANN's words for a failed or timed-out collective (libtorch_npu.so, utils/_error_code.py;
# CANN's HCCL error codes are EI0001-EI9999)
HCCL_ERROR = re.compile(
    r"HCCL function error|ERR02\d{3} DIST|HCCL OP RETRY FAILED|Some HCCL operations have failed or timed out|"
    r"Watchdog caught collective operation timeout|Heartbeat monitor timed out|\bEI\d{4}\b"
)
# Ray's prefix on a worker's output line: "(WorkerDict pid=48211, ip=10.0.0.12)"
_RAY_PREFIX = re.compile(r"\((?:[\w.:]+ )?pid=(\d+)(?:, ip=([\d.:a-fA-F]+))?\)")
_RANK_ID = re.compile(r"RankID:(\d+)")
_ERROR_LINE = re.compile(r"\b(\w*(?:Error|Exception|Interrupt))\b:? ?(.*)")
SHOWN_CHARS = 160  # of an error line quoted in the phrase


@dataclass(frozen=True)
class Cause:
    what: str  # "a hang of rank 2 (node 10.0.0.12 a3-node-05, pid 48211) in update of step 3"
    step: int | None
    not_restartable: str = ""


@dataclass(frozen=True)
class LostNode:
    label: str  # "10.0.0.12 (a3-node-05)"
    reason: str = ""  # Ray's death reason, when it gives one


def lost_since(before: Sequence[LostNode], now: Sequence[LostNode]) -> list[LostNode]:
    """The dead nodes of ``now`` that ``before`` did not have (by label, counted: a node that died, rejoined and
    died again is lost again)."""
    seen = Counter(n.label for n in before)
    out = []
    for node in now:
        if seen[node.label] > 0:
            seen[node.label] -= 1
        else:
            out.append(node)
    return out


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


def _shorten(text: str, limit: int = SHOWN_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def running_step(text: str) -> int | None:
    """The step this run was in when it ended: after the last step it logged, else after the one it resumed
    from; None before either (a failure while starting)."""
    # lazy: the trainer's log formats live with their readers, which load torch; only a failed run needs them
    from verl_patches.checkpoint.trainer_io import RESUME_PREFIX
    from verl_patches.driver.run_metrics import STEP_LINE

    logged = [int(m.group(1)) for m in STEP_LINE.finditer(text) if len(m.group(1)) <= 12]
    if logged:
        return max(logged) + 1
    resumed = [m.group(1) or m.group(2) for m in re.finditer(re.escape(RESUME_PREFIX) + _RESUMED, text)]
    return int(resumed[-1]) + 1 if resumed else None


def _at_step(step: int | None) -> str:
    return f"in step {step}" if step is not None else "before its first step"


def from_hang_report(report: str) -> Cause:
    """The phrase for a driver's hang report (`hang_diagnosis.hang_message` / `death_message`)."""
    head = _REPORT_STEP.match(report)
    call = head.group(1) if head else "a worker call"
    step = _int_or_none(head.group(2)) if head else None
    died = "worker process died:" in report
    body = report.split("worker process died:" if died else "stuck:", 1)[-1]
    who = _WHO.search(body)
    if who:
        rank, node, pid = who.group(1), who.group(2).strip(), who.group(3)
        where = _WHERE.search(body, who.end())
        phase = where.group(1) if where else "?"
        step = _int_or_none(where.group(2)) if where and step is None else step
        others = len(_WHO.findall(body.split("waiting on", 1)[0])) - 1
        more = f" (and {others} more rank{'s' if others > 1 else ''})" if others > 0 else ""
        kind = "the death" if died else "a hang"
        return Cause(f"{kind} of rank {rank} (node {node}, pid {pid}){more} in {phase} of step {_step(step)}", step)
    same = _SAME_PLACE.search(body)
    if same:
        return Cause(
            f"a collective or device fault: ranks {same.group(1)} all alive and stopped in {same.group(2)} of "
            f"step {_step(step)} (no rank or node behind another)",
            step,
        )
    never = _NEVER.search(body)
    if never:
        return Cause(f"a hang in {call} of step {_step(step)}: {_shorten(never.group(1))} never reported", step)
    return Cause(f"a hang in {call} of step {_step(step)}: {_shorten(body, 120)}", step)


def _step(step: int | None) -> str:
    return "?" if step is None else str(step)


def _hccl_error(text: str) -> tuple[str, str] | None:
    """(where, the line) of the last HCCL error line: node and pid from Ray's prefix, the rank from torch_npu's."""
    lines = [line for line in text.splitlines() if HCCL_ERROR.search(line)]
    if not lines:
        return None
    line = lines[-1]
    prefix = _RAY_PREFIX.search(line)
    rank = _RANK_ID.search(line)
    parts = []
    if rank:
        parts.append(f"rank {rank.group(1)}")
    if prefix:
        parts.append(f"node {prefix.group(2) or 'of the driver'}, pid {prefix.group(1)}")
    where = ", ".join(parts) or "node ?"
    shown = line[prefix.end() :] if prefix else line
    return where, _shorten(shown)


def _last_error(text: str) -> str:
    for line in reversed(text.splitlines()[-200:]):
        m = _ERROR_LINE.search(line)
        if m and not line.lstrip().startswith(("File ", "Traceback")):
            return _shorten(m.group(0))
    return ""


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def diagnose(
    text: str,
    returncode: int,
    node: str,
    pid: int,
    lost_nodes: Sequence[LostNode] = (),
    stopped: bool = False,
) -> Cause:
    """Why this run of the trainer ended (``returncode`` != 0). ``text``: its output; ``node``/``pid``: where the
    trainer (the driver) ran; ``lost_nodes``: nodes Ray marked dead during the run; ``stopped``: the launcher
    was asked to stop (Ctrl-C, `launch.cluster.stop`) and passed it on."""
    step = running_step(text)
    if stopped:
        return Cause(
            f"a stop request (the trainer on node {node}, pid {pid}, ended with status {returncode} {_at_step(step)})",
            step,
            "the run was stopped on purpose (Ctrl-C or `python -m verl_patches.launch.cluster.stop`)",
        )
    report = last_report(text)
    if lost_nodes:
        first = lost_nodes[0]
        others = len(lost_nodes) - 1
        more = f" (and {others} more node{'s' if others > 1 else ''})" if others else ""
        reason = f"; Ray: {_shorten(first.reason, 100)}" if first.reason else ""
        at = from_hang_report(report).step if report else None
        at = at if at is not None else step
        return Cause(f"the loss of node {first.label}{more} {_at_step(at)}{reason}", at)
    if report:
        cause = from_hang_report(report)
        return cause if cause.step is not None or step is None else Cause(cause.what, step)
    hccl = _hccl_error(text)
    if hccl:
        where, line = hccl
        return Cause(f"an HCCL error ({where}) {_at_step(step)}: {line}", step)
    if returncode < 0:
        return Cause(
            f"the trainer being killed by {_signal_name(-returncode)} (node {node}, pid {pid}) {_at_step(step)}", step
        )
    if returncode == REFUSED_STATUS:
        return Cause(
            f"the trainer's refusal (exit status 2, node {node}) {_at_step(step)}",
            step,
            "exit status 2 is the trainer refusing its config or input (the line above says why); a restart would "
            "refuse it again",
        )
    error = _last_error(text)
    return Cause(
        f"the trainer's exit with status {returncode} (node {node}, pid {pid}) {_at_step(step)}"
        + (f": {error}" if error else ""),
        step,
    )
