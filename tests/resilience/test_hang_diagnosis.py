"""Who holds a worker call up, and the one line that says so (pure)."""

from __future__ import annotations

import itertools

import pytest

from verl_patches.resilience.hang_diagnosis import (
    REPORT_PREFIX,
    Observed,
    death_message,
    diagnose,
    hang_message,
    last_report,
    rank_list,
)
from verl_patches.resilience.progress import Position

STALE = 10.0


def rec(rank: int, phase: str = "update", index: int | None = 2, step: int = 5, where: str = "") -> dict:
    pos = Position(
        marks=40 + rank,
        call="update_actor",
        step=step,
        phase=phase,
        unit="micro-batch" if index else "",
        index=index,
        total=4 if index else None,
        group=1 if index else 0,
    )
    return {
        "rank": rank,
        "node": "10.0.0.7",
        "host": "node-7",
        "pid": 1000 + rank,
        "log": f"/tmp/ray/session_x/logs/worker-{rank}.out",
        "beat": 3,
        "activity": 0,
        "pos": pos.to_dict(),
        "where": where,
    }


def alive(rank: int, **kw) -> Observed:
    return Observed(f"worker {rank}", rec(rank, **kw), silent_s=0.5, stalled_s=61.0)


def frozen(rank: int, silent: float = 64.0, **kw) -> Observed:
    return Observed(f"worker {rank}", rec(rank, **kw), silent_s=silent, stalled_s=64.0)


def test_a_frozen_rank_is_named_with_node_pid_phase_step_micro_batch_and_log() -> None:
    d = diagnose("update_actor", 5, [alive(0, index=3), frozen(1, index=2), alive(2, index=3)], 60, STALE)
    assert d.culprit_ranks == [1]
    msg = hang_message(d)
    assert msg.startswith(
        f"{REPORT_PREFIX} update_actor (step 5) made no progress for 61 s "
        "(VERL_PATCHES_COLLECTIVE_TIMEOUT_S=60); stuck: rank 1 (node 10.0.0.7 node-7, pid 1001) "
        "stopped reporting 64 s ago (process frozen or dead), last in phase 'update' "
        "(micro-batch 2/4 of batch 1) of step 5 in update_actor; "
        "its log: 10.0.0.7:/tmp/ray/session_x/logs/worker-1.out"
    )
    assert msg.endswith(
        "; waiting on it: ranks 0,2 in phase 'update' (micro-batch 3/4 of batch 1) of step 5 in update_actor (alive)"
    )
    assert "\n" not in msg


def test_an_alive_rank_behind_its_peers_is_named_with_where_its_main_thread_is() -> None:
    d = diagnose(
        "update_actor", 5, [alive(0, index=3), alive(1, index=1, where="x.py:9 spin"), alive(2, index=3)], 60, STALE
    )
    assert d.culprit_ranks == [1] and not d.same_place
    assert (
        "rank 1 (node 10.0.0.7 node-7, pid 1001) is alive but made no progress for 61 s in phase 'update' "
        "(micro-batch 1/4 of batch 1) of step 5 in update_actor while its peers moved past it; main thread at "
        "x.py:9 spin" in d.culprits[0]
    )


def test_a_rank_in_an_earlier_phase_or_step_is_behind() -> None:
    d = diagnose(
        "generate_sequences",
        6,
        [alive(0, phase="generate", index=None, step=6), alive(1, phase="idle", index=None, step=5)],
        60,
        STALE,
    )
    assert d.culprit_ranks == [1]
    assert (
        "phase 'idle' of step 5 after update_actor while its peers moved past it; it has not started "
        "generate_sequences (phase 'weight_sync'); its log: " in d.culprits[0]
    )


def test_a_rank_frozen_between_calls_is_said_not_to_have_started_the_call() -> None:
    d = diagnose(
        "actor_rollout_ref_compute_ref_log_prob",
        4,
        [frozen(3, phase="idle", index=None, step=4), alive(0, phase="ref", index=2, step=4)],
        60,
        STALE,
    )
    assert d.culprit_ranks == [3]
    assert (
        "last in phase 'idle' of step 4 after update_actor; it has not started "
        "actor_rollout_ref_compute_ref_log_prob (phase 'ref'); its log:" in d.culprits[0]
    )


def test_all_alive_at_one_place_names_all_of_them() -> None:
    d = diagnose("update_actor", 5, [alive(r, index=2) for r in (2, 0, 1)], 60, STALE)
    assert d.same_place and d.culprit_ranks == [0, 1, 2]
    assert d.culprits[0].startswith(
        "no rank is behind another: ranks 0-2 are all alive and stopped in phase "
        "'update' (micro-batch 2/4 of batch 1) of step 5"
    )


def test_never_reported() -> None:
    d = diagnose(
        "init_model",
        None,
        [Observed("worker 3 of the group", None, 70, 70), alive(0, phase="init", index=None)],
        60,
        STALE,
    )
    assert d.culprits[0] == (
        "worker 3 of the group never reported a heartbeat (it did not start, or froze before its first report)"
    )
    assert hang_message(d).startswith(f"{REPORT_PREFIX} init_model (step 5) made no progress")  # the ranks' step


@pytest.mark.parametrize("states", list(itertools.product(["frozen", "behind", "ahead"], repeat=3)))
def test_exactly_the_frozen_and_the_hindmost_alive_ranks_are_named(states: tuple[str, ...]) -> None:
    obs = []
    for r, s in enumerate(states):
        obs.append(frozen(r, index=2) if s == "frozen" else alive(r, index=1 if s == "behind" else 3))
    d = diagnose("update_actor", 5, obs, 60, STALE)
    frozen_ranks = {r for r, s in enumerate(states) if s == "frozen"}
    live = {r: s for r, s in enumerate(states) if s != "frozen"}
    expected = set(frozen_ranks)
    if live and len(set(live.values())) > 1:
        expected |= {r for r, s in live.items() if s == "behind"}
    elif live and not frozen_ranks:
        expected |= set(live)
    assert set(d.culprit_ranks) == expected
    waiting = " ".join(d.waiting)
    for r in set(live) - expected:
        assert f" {r}" in waiting or f",{r}" in waiting


def test_the_stale_threshold_decides_frozen_or_alive() -> None:
    assert (
        diagnose("x", 1, [frozen(0, silent=STALE - 0.1), alive(1, index=3)], 60, STALE)
        .culprits[0]
        .startswith("rank 0 (node 10.0.0.7 node-7, pid 1000) is alive but")
    )
    assert (
        "stopped reporting 10 s ago"
        in diagnose("x", 1, [frozen(0, silent=STALE), alive(1, index=3)], 60, STALE).culprits[0]
    )


def test_death_message_names_the_dead_worker_with_its_last_position() -> None:
    msg = death_message("update_actor", 5, [frozen(2, index=2)], "ActorDiedError")
    assert msg == (
        f"{REPORT_PREFIX} update_actor (step 5): worker process died: rank 2 (node 10.0.0.7 node-7, "
        "pid 1002) last in phase 'update' (micro-batch 2/4 of batch 1) of step 5 in update_actor; its log: "
        "10.0.0.7:/tmp/ray/session_x/logs/worker-2.out (ActorDiedError)"
    )


def test_last_report_is_taken_from_its_prefix_to_the_end_of_its_line() -> None:
    log = (
        "step:1 - x:1\n(TaskRunner pid=9) verl_patches hang: first\nTraceback ...\n"
        "verl_patches.resilience.worker_deadline.WorkerHangError: verl_patches hang: update_actor (step 5) x\n"
        "(raylet) a worker died\n"
    )
    assert last_report(log) == "verl_patches hang: update_actor (step 5) x"
    assert last_report("nothing here") is None


def test_rank_lists_fold_runs_of_three_or_more() -> None:
    assert rank_list([]) == ""
    assert rank_list([3]) == "3"
    assert rank_list([1, 0]) == "0,1"
    assert rank_list([9, 0, 1, 2, 5, 6, 12, 11, 10, 13]) == "0-2,5,6,9-13"
    assert rank_list([r for r in range(256) if r != 37]) == "0-36,38-255"
