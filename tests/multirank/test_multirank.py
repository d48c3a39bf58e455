"""The multi-rank harness (`verl_patches.multirank`) on 2 or 3 CPU ranks over gloo: results in rank order, a
rank that raised named with its traceback, hung ranks stopped at one deadline for all ranks together with their
stacks shown, and no rank left running afterwards."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from verl_patches import multirank
from verl_patches.base.rank_exit import exit_rank
from verl_patches.multirank import RankFailure, run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(180)]


def _all_reduce_and_env(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank + 1])
    dist.all_reduce(t)
    if rank == 0:
        time.sleep(1.0)  # rank 0 ends last: the results come in rank order, not in the order ranks end
    names = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR")
    return {"sum": int(t), "env": {k: os.environ[k] for k in names}}


def test_results_come_back_in_rank_order() -> None:
    out = run_ranks(_all_reduce_and_env, 2, timeout_s=90)
    assert out == [
        {
            "sum": 3,
            "env": {
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
            },
        }
        for r in range(2)
    ]


def _env_without_a_group(rank: int, world: int, key: str) -> list:
    import torch.distributed as dist

    return [os.environ.get("LOCAL_RANK"), os.environ.get(key), dist.is_initialized()]


def test_rank_env_sets_and_unsets_per_rank_and_backend_none_makes_no_group() -> None:
    env = [{"LOCAL_RANK": None, "MULTIRANK_TEST_VAR": "a"}, {"MULTIRANK_TEST_VAR": "b"}]
    out = run_ranks(_env_without_a_group, 2, 90, backend=None, rank_env=env, kwargs={"key": "MULTIRANK_TEST_VAR"})
    assert out == [[None, "a", False], ["1", "b", False]]


def _record_setup(rank: int, world: int) -> None:
    import torch.distributed as dist

    seen = {
        "preloaded": "colorsys" in sys.modules,
        "overlay": "verl_patches.prelude_patch" in sys.modules,
        "group": dist.is_initialized(),
    }
    os.environ["MULTIRANK_TEST_SETUP"] = json.dumps(seen)


def _what_setup_saw(rank: int, world: int) -> dict:
    import torch.distributed as dist

    return {"setup saw": json.loads(os.environ["MULTIRANK_TEST_SETUP"]), "group": dist.is_initialized()}


def test_setup_runs_after_the_callers_preloads_and_before_the_group() -> None:
    """The harness imports what its caller names (the overlay, for a rank of the job), nothing of its own."""
    out = run_ranks(_what_setup_saw, 1, 90, preload=("colorsys",), setup=_record_setup)
    assert out == [{"setup saw": {"preloaded": True, "overlay": False, "group": False}, "group": True}]


def _unreportable_or_dead(rank: int, world: int) -> object:
    if rank == 0:
        return object()  # not JSON: the rank reports the error instead of a result
    print("rank one's last words", flush=True)
    exit_rank(3)


def test_a_result_that_is_not_json_and_a_rank_that_died_are_named() -> None:
    with pytest.raises(RankFailure) as info:
        run_ranks(_unreportable_or_dead, 2, 90, backend=None)
    text = str(info.value)
    assert (info.value.ranks, info.value.hung) == ([0, 1], [])
    assert "rank 0 raised (TypeError: Object of type object is not JSON serializable)" in text
    assert "rank 1 exited with status 3 and no result" in text and "rank one's last words" in text


def _sleep_forever_in_rank() -> None:
    while True:
        time.sleep(1)


def _write_pid(pid_dir: str, rank: int) -> None:
    Path(pid_dir, f"{rank}.pid").write_text(str(os.getpid()))


def _assert_ranks_gone(pid_dir: Path, world: int) -> None:
    for r in range(world):
        pid = int((pid_dir / f"{r}.pid").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _rank_0_raises_rank_1_hangs(rank: int, world: int, pid_dir: str) -> None:
    _write_pid(pid_dir, rank)
    if rank == 0:
        raise ValueError("rank zero refuses its input")
    _sleep_forever_in_rank()


def test_a_raising_rank_is_named_with_its_traceback_and_its_peers_do_not_run_to_the_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(multirank, "PEER_GRACE_S", 2.0)
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_rank_0_raises_rank_1_hangs, 2, 120, kwargs={"pid_dir": str(tmp_path)})
    assert time.monotonic() - start < 60  # the peer was stopped 2 s after rank 0 failed, not at the deadline
    text = str(info.value)
    assert (info.value.ranks, info.value.hung) == ([0, 1], [1])
    assert text.startswith("2 of 2 ranks failed: rank 0 raised (ValueError: rank zero refuses its input)")
    assert "in _rank_0_raises_rank_1_hangs" in text  # rank 0's traceback
    assert "rank 1 was still running at 2 s after rank 0 failed" in text and "in _sleep_forever_in_rank" in text
    _assert_ranks_gone(tmp_path, 2)


def _ranks_1_and_2_hang(rank: int, world: int, pid_dir: str) -> str:
    _write_pid(pid_dir, rank)
    if rank:
        _sleep_forever_in_rank()
    return "done"


@pytest.mark.slow  # it waits out its deadline, which must cover 3 ranks' start on a loaded host
def test_hung_ranks_fail_at_one_deadline_for_all_with_their_stacks(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    deadline = 30.0
    start = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_ranks(_ranks_1_and_2_hang, 3, deadline, kwargs={"pid_dir": str(tmp_path)})
    elapsed = time.monotonic() - start
    assert deadline <= elapsed < 1.5 * deadline  # one deadline, not one per hung rank in turn (2 x 30 s)
    assert (info.value.ranks, info.value.hung) == ([1, 2], [1, 2])
    text = str(info.value)
    for r in (1, 2):
        assert f"rank {r} was still running at the deadline (30 s for all 3 ranks together)" in text
    assert text.count("in _sleep_forever_in_rank") == 2  # each hung rank's stack, where it hangs
    printed = capfd.readouterr().err  # printed as soon as the deadline passed, with the rank number
    assert "rank 1 (pid" in printed and "rank 2 (pid" in printed and "in _sleep_forever_in_rank" in printed
    _assert_ranks_gone(tmp_path, 3)
