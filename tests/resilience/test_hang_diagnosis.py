"""The pure part of hang detection: which ranks hold a collective up, and the one-line message."""

from __future__ import annotations

import itertools

import pytest

from verl_patches.resilience.hang_diagnosis import Hang, RankStatus, blame, group_key, hang_message

G = group_key([0, 1, 2, 3])
HANG = Hang(op="all_reduce", group=G, seq=7, step=12, waited_s=31.0)
NOW = 1000.0


def st(rank: int, entered: int, current: str = "", since: float | None = None, hb: float = NOW - 1,
       step: int | None = 12) -> RankStatus:
    return RankStatus(rank, step, hb, {G: entered}, current, since)


def test_no_culprit_when_every_member_entered_the_collective() -> None:
    statuses = {r: st(r, 7, f"all_reduce #7 on group [{G}]", NOW - 30) for r in (1, 2, 3)}
    assert blame(0, HANG, [0, 1, 2, 3], statuses, NOW, 10) == []
    msg = hang_message(0, HANG, [0, 1, 2, 3], statuses, NOW, 10)
    assert msg.startswith(f"collective hang: rank 0 waited 31 s in all_reduce #7 on group [{G}] at step 12")
    assert "every member of the group entered it" in msg


def test_alive_rank_elsewhere_is_named_with_where_it_is() -> None:
    statuses = {1: st(1, 7), 2: st(2, 6, "broadcast #3 on group [2,3]", NOW - 40), 3: st(3, 7)}
    (only,) = blame(0, HANG, [0, 1, 2, 3], statuses, NOW, 10)
    assert only.startswith("rank 2 is alive but has entered only 6 collective(s) on this group (this is #7)")
    assert "step 12, inside broadcast #3 on group [2,3] for 40 s" in only


def test_silent_and_never_started_ranks() -> None:
    statuses = {1: st(1, 7), 2: st(2, 7, hb=NOW - 50), 3: None}
    out = blame(0, HANG, [0, 1, 2, 3], statuses, NOW, 10)
    assert out[0].startswith("rank 2 stopped reporting 50 s ago (process dead or frozen)")
    assert out[1] == "rank 3 never reported (not started, or died before its first collective)"


def test_a_rank_ahead_of_us_is_not_blamed() -> None:
    statuses = {1: st(1, 9), 2: st(2, 8), 3: st(3, 7)}
    assert blame(0, HANG, [0, 1, 2, 3], statuses, NOW, 10) == []


@pytest.mark.parametrize("entered", list(itertools.product([5, 6, 7, 8], repeat=3)))
def test_exactly_the_members_below_the_sequence_number_are_blamed(entered) -> None:
    statuses = {r: st(r, e) for r, e in zip((1, 2, 3), entered)}
    blamed = {int(line.split()[1]) for line in blame(0, HANG, [0, 1, 2, 3], statuses, NOW, 10)}
    assert blamed == {r for r, e in zip((1, 2, 3), entered) if e < 7}


def test_group_key_is_order_free() -> None:
    assert group_key([3, 1, 2]) == group_key((1, 2, 3)) == "1,2,3"
