"""The watcher of one worker call, on a fake clock: a call is hung when no outstanding rank moved for the
time-out; a slow rank that moves is not; every duration is on the watcher's clock."""

from __future__ import annotations

import json

from verl_patches.resilience.boards import DictBoard
from verl_patches.resilience.call_watch import CallWatch
from verl_patches.resilience.progress import Position

T = 30.0


class Ranks:
    """What each rank would publish: beats and marks move when the test says so."""

    def __init__(self, n: int) -> None:
        self.board = DictBoard()
        self.beat = {r: 0 for r in range(n)}
        self.marks = {r: 10 for r in range(n)}
        self.index = {r: 1 for r in range(n)}
        self.activity = {r: 0 for r in range(n)}
        self.coarse = False
        self.publish(*range(n))

    def publish(self, *ranks: int) -> None:
        for r in ranks:
            self.beat[r] += 1
            pos = Position(
                self.marks[r],
                "update_actor",
                4,
                "generate" if self.coarse else "update",
                "" if self.coarse else "micro-batch",
                None if self.coarse else self.index[r],
                None,
                1,
                self.coarse,
            )
            self.board.publish(
                f"k{r}",
                json.dumps(
                    {
                        "rank": r,
                        "node": "n",
                        "host": "h",
                        "pid": r,
                        "beat": self.beat[r],
                        "activity": self.activity[r],
                        "pos": pos.to_dict(),
                        "where": "",
                    }
                ),
            )

    def step(self, *ranks: int) -> None:
        for r in ranks:
            self.marks[r] += 1
            self.index[r] += 1


def watch(ranks: Ranks, now: list[float]) -> CallWatch:
    return CallWatch(
        "update_actor", 4, {f"k{r}": f"worker {r}" for r in ranks.beat}, T, ranks.board, clock=lambda: now[0]
    )


def test_a_frozen_rank_is_reported_one_time_out_after_the_last_progress() -> None:
    now, ranks = [0.0], Ranks(3)
    w = watch(ranks, now)
    for t in range(1, 6):  # everyone moves for 5 s, then rank 1 freezes and the others block a moment later
        now[0] = float(t)
        ranks.step(0, 1, 2)
        ranks.publish(0, 1, 2)
        assert w.observe(["k0", "k1", "k2"]) is None
    now[0] = 6.0
    ranks.step(0, 2)
    ranks.publish(0, 2)
    assert w.observe(["k0", "k1", "k2"]) is None
    while now[0] < 6.0 + T - 1:  # blocked peers keep beating; nothing moves
        now[0] += 1
        ranks.publish(0, 2)
        assert w.observe(["k0", "k1", "k2"]) is None, now
    now[0] = 6.0 + T
    ranks.publish(0, 2)
    d = w.observe(["k0", "k1", "k2"])
    assert d is not None and d.culprit_ranks == [1] and d.stalled_s == T
    assert "stopped reporting 31 s ago (process frozen or dead)" in d.culprits[0]
    assert d.waiting == ["ranks 0,2 in phase 'update' (micro-batch 7 of batch 1) of step 4 in update_actor (alive)"]


def test_a_slow_rank_that_moves_keeps_the_call_alive_however_long_its_peers_wait() -> None:
    now, ranks = [0.0], Ranks(2)
    w = watch(ranks, now)
    for _ in range(10):  # rank 1 takes 0.8 T per unit; rank 0 waits 8 time-outs in all
        for _ in range(24):
            now[0] += 1
            ranks.publish(0, 1)
            assert w.observe(["k0", "k1"]) is None
        ranks.step(1)
        ranks.publish(1)
    assert now[0] > 7 * T


def test_a_rank_that_finished_no_longer_counts() -> None:
    now, ranks = [0.0], Ranks(2)
    w = watch(ranks, now)
    now[0] = T + 1
    assert w.observe(["k1"]).culprit_ranks == [1]  # rank 0 answered; rank 1 alone, alive, never moved


def test_activity_in_a_coarse_phase_is_progress() -> None:
    now, ranks = [0.0], Ranks(2)
    ranks.coarse = True
    ranks.publish(0, 1)
    w = watch(ranks, now)
    for _ in range(int(3 * T)):
        now[0] += 1
        ranks.activity[0] += 1  # its main thread's stack keeps changing (a decode loop with no marks of ours)
        ranks.publish(0, 1)
        assert w.observe(["k0", "k1"]) is None
    now[0] += T
    ranks.publish(0, 1)
    assert w.observe(["k0", "k1"]) is not None


def test_a_rank_that_never_published_counts_from_the_start_of_the_call() -> None:
    now, ranks = [0.0], Ranks(1)
    w = CallWatch(
        "init_model", None, {"k0": "worker 0", "missing": "worker 1 of the group"}, T, ranks.board, clock=lambda: now[0]
    )
    now[0] = T - 1
    assert w.observe(["missing"]) is None
    now[0] = T
    d = w.observe(["missing"])
    assert d.culprits == [
        "worker 1 of the group never reported a heartbeat (it did not start, or froze before its first report)"
    ]


def test_an_unreadable_board_is_no_news() -> None:
    class Broken(DictBoard):
        def read(self, keys):
            raise ConnectionError("gcs restarting")

    now = [0.0]
    w = CallWatch("update_actor", 4, {"k0": "worker 0"}, T, Broken(), clock=lambda: now[0])
    assert w.observe(["k0"]) is None and w.read_errors == 1
    now[0] = T
    assert w.observe(["k0"]).culprits[0].startswith("worker 0 never reported")


def test_a_member_still_being_created_counts_as_moving_up_to_the_startup_allowance() -> None:
    from verl_patches.resilience.call_watch import startup_allowance

    now, ranks = [0.0], Ranks(1)
    state = {"state": "PENDING_CREATION", "node": "10.0.0.9", "pid": 77}
    w = CallWatch(
        "init_model",
        None,
        {"k0": "worker 0", "new": "worker 1 of the group"},
        T,
        ranks.board,
        clock=lambda: now[0],
        lookup=lambda keys: {k: state for k in keys if k == "new"},
    )
    while now[0] < startup_allowance(T) - 1:
        now[0] += 10
        assert w.observe(["new"]) is None
    now[0] = startup_allowance(T) + T
    d = w.observe(["new"])
    assert d.culprits[0].startswith(
        "worker 1 of the group (node 10.0.0.9, pid 77, scheduler state PENDING_CREATION) never reported a heartbeat"
    )
    state["state"] = "ALIVE"  # created but silent: counts from the start like any other
    w2 = CallWatch(
        "init_model",
        None,
        {"new": "worker 1 of the group"},
        T,
        ranks.board,
        clock=lambda: now[0],
        lookup=lambda keys: {k: state for k in keys},
    )
    now[0] += T
    assert w2.observe(["new"]) is not None


def test_a_member_that_publishes_but_whose_actor_is_still_being_created_counts_as_moving() -> None:
    """verl's Worker.__init__ starts the heartbeat; the rest of the worker's constructor may take long."""
    now = [0.0]
    board = DictBoard()
    board.publish(
        "k0", json.dumps({"rank": 0, "beat": 1, "activity": 0, "pos": Position(0, "", None, "idle").to_dict()})
    )
    w = CallWatch(
        "init_model",
        None,
        {"k0": "worker 0"},
        T,
        board,
        clock=lambda: now[0],
        lookup=lambda keys: {k: {"state": "PENDING_CREATION"} for k in keys},
    )
    now[0] = 3 * T
    assert w.observe(["k0"]) is None
