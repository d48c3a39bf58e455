"""What ended a trainer run, in the phrase a restart line carries (`verl_patches.launch.failure_diagnosis`).

The hang reports are made by the driver's own functions (`resilience.hang_diagnosis`), so a change of their
wording that the launcher can no longer read fails here; the HCCL lines are torch_npu 2.5.1's own words."""

from __future__ import annotations

import pytest

from verl_patches.launch.failure_diagnosis import (
    REFUSED_STATUS,
    LostNode,
    diagnose,
    from_hang_report,
    lost_since,
    running_step,
)
from verl_patches.resilience.hang_diagnosis import Observed, death_message, hang_message
from verl_patches.resilience.hang_diagnosis import diagnose as diagnose_hang
from verl_patches.resilience.progress import Position

NODE, PID = "10.0.0.1 head-01", 4242


def rec(rank: int, phase: str, step: int, call: str = "update_actor", host: str = "a3-node-05") -> dict:
    pos = Position(40 + rank, call, step, phase, "micro-batch", 2, 8, 1)
    return {"rank": rank, "node": "10.0.0.12", "host": host, "pid": 48200 + rank, "log": "/tmp/x.out", "beat": 3,
            "activity": 0, "pos": pos.to_dict(), "where": ""}  # fmt: skip


def run_output(*lines: str, resumed: int | None = 2, logged: tuple[int, ...] = (3, 4)) -> str:
    out = ["main_ppo_npu: versions as pinned"]
    if resumed is not None:
        out.append(
            f"(TaskRunner pid=7) verl_patches resume: from /ckpt/global_step_{resumed} (step {resumed}; actor "
            "TP2xPP1xEP2 DP2; model, optimizer, RNG and dataloader restored)"
            if resumed
            else "(TaskRunner pid=7) verl_patches resume: starting from step 0 (no complete checkpoint under /ckpt)"
        )
    out += [f"(TaskRunner pid=7) step:{s} - critic/score/mean:0.250 - actor/pg_loss:0.010" for s in logged]
    return "\n".join([*out, *lines]) + "\n"


def test_a_frozen_rank_is_named_with_its_node_pid_phase_and_step() -> None:
    d = diagnose_hang(
        "update_actor",
        3,
        [Observed("w0", rec(0, "update", 3), 0.5, 30), Observed("w2", rec(2, "update", 3), 30, 30)],
        20,
        2,
    )
    text = run_output(hang_message(d), "Traceback (most recent call last):", "WorkerHangError: ...", logged=())
    cause = diagnose(text, 1, NODE, PID)
    assert cause.what == "a hang of rank 2 (node 10.0.0.12 a3-node-05, pid 48202) in update of step 3"
    assert cause.step == 3 and not cause.not_restartable


def test_a_rank_behind_its_peers_and_a_dead_worker() -> None:
    behind = diagnose_hang(
        "generate_sequences",
        5,
        [Observed("w0", rec(0, "weight_sync", 5), 0.5, 30), Observed("w1", rec(1, "generate", 5), 0.5, 30)],
        20,
        2,
    )
    assert from_hang_report(hang_message(behind)).what == (
        "a hang of rank 0 (node 10.0.0.12 a3-node-05, pid 48200) in weight_sync of step 5"
    )
    died = death_message("generate_sequences", None, [Observed("w1", rec(1, "generate", 5), 1, 1)], "ActorDiedError")
    cause = diagnose(run_output(died), 1, NODE, PID)
    assert cause.what == "the death of rank 1 (node 10.0.0.12 a3-node-05, pid 48201) in generate of step 5"
    assert cause.step == 5


def test_several_culprits_all_ranks_at_one_place_and_a_rank_that_never_reported() -> None:
    two = diagnose_hang("update_actor", 3, [Observed(f"w{r}", rec(r, "update", 3), 30, 30) for r in (1, 3)], 20, 2)
    assert from_hang_report(hang_message(two)).what.endswith("pid 48201) (and 1 more rank) in update of step 3")
    same = diagnose_hang("update_actor", 3, [Observed(f"w{r}", rec(r, "update", 3), 0.5, 30) for r in range(4)], 20, 2)
    assert from_hang_report(hang_message(same)).what == (
        "a collective or device fault: ranks 0-3 all alive and stopped in update of step 3 (no rank or node behind "
        "another)"
    )
    never = diagnose_hang("update_actor", 3, [Observed("worker 3 of the group", None, 30, 30)], 20, 2)
    assert from_hang_report(hang_message(never)).what == (
        "a hang in update_actor of step 3: worker 3 of the group never reported"
    )


def test_the_host_without_a_name_still_reads() -> None:
    d = diagnose_hang("update_actor", 3, [Observed("w2", rec(2, "update", 3, host=""), 30, 30)], 20, 2)
    assert from_hang_report(hang_message(d)).what.startswith("a hang of rank 2 (node 10.0.0.12, pid 48202)")


@pytest.mark.parametrize(
    "line",
    [
        "(WorkerDict pid=48211, ip=10.0.0.12) RuntimeError: HCCL function error: HcclAllReduce(...), error code is 7",
        "(WorkerDict pid=48211, ip=10.0.0.12) [ERROR] 2026-01-01-10:00:00 (PID:48211, Device:3, RankID:37) ERR02200 "
        "DIST call hccl api failed.",
        "(WorkerDict pid=48211, ip=10.0.0.12) EI0006: Getting socket times out. Reason: 1. The remote does not ...",
        "(WorkerDict pid=48211, ip=10.0.0.12) [Rank 37] Watchdog caught collective operation timeout: WorkHCCL(...)",
    ],
)
def test_an_hccl_error_names_its_node_and_pid(line: str) -> None:
    cause = diagnose(run_output(line, "Traceback ...", "RayTaskError: boom"), 1, NODE, PID)
    assert cause.what.startswith("an HCCL error (") and "node 10.0.0.12, pid 48211) in step 5: " in cause.what
    assert cause.step == 5 and "\n" not in cause.what
    if "RankID:37" in line:
        assert cause.what.startswith("an HCCL error (rank 37, node 10.0.0.12, pid 48211)")


def test_a_lost_node_comes_first_with_rays_reason() -> None:
    lost = [LostNode("10.0.0.9 (a3-node-09)", "health check failed: the raylet is not responding")]
    died = death_message("update_actor", 4, [Observed("w1", rec(1, "update", 4), 1, 1)], "ActorDiedError")
    cause = diagnose(run_output(died), 1, NODE, PID, lost)
    assert cause.what == (
        "the loss of node 10.0.0.9 (a3-node-09) in step 4; Ray: health check failed: the raylet is not responding"
    )
    two = diagnose(run_output(), 1, NODE, PID, [LostNode("a"), LostNode("b")])
    assert two.what == "the loss of node a (and 1 more node) in step 5"


def test_lost_since_counts_nodes_that_were_dead_already() -> None:
    before = [LostNode("a", "old")]
    assert lost_since(before, [LostNode("a", "old")]) == []
    assert lost_since(before, [LostNode("a", "old"), LostNode("a", "new"), LostNode("b")]) == [
        LostNode("a", "new"),
        LostNode("b"),
    ]


def test_the_trainers_own_exit_a_signal_a_refusal_an_error_and_a_stop() -> None:
    killed = diagnose(run_output(logged=()), -9, NODE, PID)
    assert killed.what == "the trainer being killed by SIGKILL (node 10.0.0.1 head-01, pid 4242) in step 3"
    refused = diagnose("main_ppo_npu: config 'x': no key 'trainer.zz'\n", REFUSED_STATUS, NODE, PID)
    assert refused.not_restartable.startswith("exit status 2 is the trainer refusing its config")
    assert refused.what.endswith("before its first step")
    error = diagnose(run_output("Traceback (most recent call last):", '  File "x.py", line 3', "ValueError: bad"), 1,
                     NODE, PID)  # fmt: skip
    assert error.what == "the trainer's exit with status 1 (node 10.0.0.1 head-01, pid 4242) in step 5: ValueError: bad"
    stopped = diagnose(run_output(), -2, NODE, PID, stopped=True)
    assert stopped.not_restartable.startswith("the run was stopped on purpose") and stopped.step == 5


def test_the_running_step() -> None:
    assert running_step(run_output(logged=(3, 4))) == 5
    assert running_step(run_output(resumed=2, logged=())) == 3
    assert running_step(run_output(resumed=0, logged=())) == 1
    assert running_step(run_output(resumed=None, logged=())) is None
