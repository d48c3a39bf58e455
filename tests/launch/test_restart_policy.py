"""The restart policy (`verl_patches.launch.restart_policy`): every history of failures up to a small size, and
random ones, against the rules written out here independently, plus the loop it drives, simulated."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_patches.launch.restart_policy import (
    DEFAULT_A3_RESTARTS,
    STOPPED_PREFIX,
    Backoff,
    Failure,
    checkpoint_problem,
    decide,
    restart_setting,
    same_step_failed_twice,
)


def failure(step: int | None, committed: int, why_not: str = "") -> Failure:
    return Failure(f"a hang of rank 2 (node n1, pid 7) in update of step {step}", step, committed, why_not)


def expected(history: list[Failure], max_restarts: int) -> tuple[bool, str]:
    """The rules, restated: (restart?, which rule decided)."""
    last, made = history[-1], len(history) - 1
    if max_restarts == 0:
        return False, "off"
    if last.not_restartable:
        return False, "not restartable"
    if made >= max_restarts:
        return False, "budget"
    if len(history) > 1:
        before = history[-2]
        advanced = last.committed > before.committed
        further = before.step is not None and last.step is not None and last.step > before.step
        if not advanced and not further:
            return False, "no progress"
    return True, "restart"


STEPS = (None, 1, 2, 3)
COMMITTED = (0, 1, 2)
ONE = [failure(s, c, w) for s in STEPS for c in COMMITTED for w in ("", "stopped on purpose")]


@pytest.mark.parametrize("max_restarts", [0, 1, 2, 3])
def test_every_history_of_up_to_three_failures(max_restarts: int) -> None:
    checked = 0
    for length in (1, 2, 3):
        for history in itertools.product(ONE, repeat=length):
            history = list(history)
            got = decide(history, max_restarts)
            restart, rule = expected(history, max_restarts)
            assert got.restart is restart, (history, max_restarts, rule, got)
            assert "\n" not in got.line
            last = history[-1]
            if restart:
                n = len(history)
                assert got.number == n and got.delay_s == Backoff().delay(n)
                assert got.line == (
                    f"restart {n}/{max_restarts} after {last.what}; resuming from step {last.committed} in "
                    f"{got.delay_s:g} s"
                )
            elif rule == "off":
                assert got.line == ""  # restarts off: the launch ends as it always did, with no line of ours
            elif rule == "not restartable":
                assert got.line == f"not restarting after {last.what}: {last.not_restartable}"
            elif rule == "budget":
                assert got.line.startswith(f"{STOPPED_PREFIX} {len(history) - 1} restart") and last.what in got.line
            else:
                step = last.step if last.step is not None else last.committed + 1
                assert got.line.startswith(f"{STOPPED_PREFIX} step {step} failed twice"), got.line
                assert f"no checkpoint newer than step {last.committed}" in got.line and last.what in got.line
            checked += 1
    assert checked == sum(len(ONE) ** n for n in (1, 2, 3))


def test_the_issue_chain_restarts_twice_then_a_repeat_stops() -> None:
    hang = Failure("a hang of rank 2 (node n1, pid 7) in update of step 3", 3, 2)
    died = Failure("the death of rank 1 (node n1, pid 9) in generate of step 5", 5, 4)
    first = decide([hang], 3)
    assert first.line == (
        "restart 1/3 after a hang of rank 2 (node n1, pid 7) in update of step 3; resuming from step 2 in 10 s"
    )
    second = decide([hang, died], 3)
    assert second.restart and second.delay_s == 20 and second.line.startswith("restart 2/3 after the death")
    again = Failure("the death of rank 1 (node n1, pid 11) in generate of step 5", 5, 4)
    stop = decide([hang, died, again], 3)
    assert not stop.restart
    assert stop.line.startswith("stopped restarting: step 5 failed twice (no checkpoint newer than step 4 was")


def test_a_later_step_without_a_new_checkpoint_is_progress_an_unknown_step_is_not() -> None:
    assert not same_step_failed_twice(failure(13, 10), failure(17, 10))  # save_freq 10: further, no new commit
    assert same_step_failed_twice(failure(13, 10), failure(13, 10))
    assert same_step_failed_twice(failure(13, 10), failure(12, 10))
    assert same_step_failed_twice(failure(None, 10), failure(17, 10))
    assert same_step_failed_twice(failure(13, 10), failure(None, 10))
    assert not same_step_failed_twice(failure(None, 10), failure(None, 20))


def test_backoff_doubles_from_its_first_wait_to_its_cap() -> None:
    b = Backoff()
    assert [b.delay(n) for n in range(1, 8)] == [10, 20, 40, 80, 160, 300, 300]
    assert Backoff(1, 5).delay(10**6) == 5
    with pytest.raises(ValueError):
        b.delay(0)


@settings(max_examples=300, deadline=None)
@given(
    faults=st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.sampled_from(["", "stopped on purpose"])), max_size=40
    ),
    max_restarts=st.integers(0, 6),
    first=st.floats(0.5, 60),
    cap=st.floats(1, 600),
)
def test_a_simulated_run_never_restarts_more_than_allowed_nor_past_a_repeated_step(
    faults: list[tuple[int, bool, str]], max_restarts: int, first: float, cap: float
) -> None:
    """A run that fails now and then: each fault comes some steps after the resume point, and the run may have
    committed a checkpoint before it. The loop over `decide` stops within the budget, on the first repeat, and
    only waits within the backoff's bounds."""
    backoff = Backoff(first, cap)
    history: list[Failure] = []
    committed, restarts = 0, 0
    for ahead, saved, why_not in faults:
        step = committed + 1 + ahead
        committed = step - 1 if saved else committed
        history.append(Failure(f"fault in step {step}", step, committed, why_not))
        d = decide(history, max_restarts, backoff)
        if not d.restart:
            assert restarts <= max_restarts
            break
        restarts += 1
        assert d.number == restarts <= max_restarts
        assert d.delay_s == min(cap, first * 2 ** (restarts - 1)) <= cap
        if len(history) > 1:
            assert not same_step_failed_twice(history[-2], history[-1])
    assert restarts <= max_restarts


def test_checkpoints_must_be_on_and_resumed_from_the_last_step() -> None:
    assert checkpoint_problem(10, "auto") == "" and checkpoint_problem("1", None) == ""
    assert checkpoint_problem(-1, "auto").startswith("trainer.save_freq=-1 writes no checkpoint")
    assert checkpoint_problem(0, "auto").startswith("trainer.save_freq=0 writes no checkpoint")
    assert "trainer.save_freq='x'" in checkpoint_problem("x", "auto")
    assert checkpoint_problem(5, "disable").startswith("trainer.resume_mode=disable: a restart would start over")
    assert "trainer.resume_mode=resume_path" in checkpoint_problem(5, "resume_path")


def test_an_explicit_request_without_checkpoints_is_refused_the_default_turned_off() -> None:
    asked = restart_setting(2, DEFAULT_A3_RESTARTS, -1, "auto")
    assert asked.restarts == 0 and asked.refusal == (
        "--max-restarts 2: trainer.save_freq=-1 writes no checkpoint, so a restart would start over from step 0 "
        "(set trainer.save_freq > 0), or give --max-restarts 0"
    )
    default = restart_setting(None, DEFAULT_A3_RESTARTS, -1, "auto")
    assert default.restarts == 0 and not default.refusal and "trainer.save_freq=-1" in default.note
    assert restart_setting(None, DEFAULT_A3_RESTARTS, 10, "auto").restarts == DEFAULT_A3_RESTARTS == 3
    assert restart_setting(0, DEFAULT_A3_RESTARTS, -1, "auto") == restart_setting(None, 0, -1, "auto")
    assert restart_setting(0, 3, -1, "auto").restarts == 0 and not restart_setting(0, 3, -1, "auto").refusal
    assert restart_setting(5, 0, 1, "auto").restarts == 5


def test_a_config_without_a_checkpoint_folder_cannot_restart() -> None:
    assert checkpoint_problem(10, "auto", None).startswith("trainer.default_local_dir is not set (CKPT_DIR")
    assert checkpoint_problem(10, "auto", "") == checkpoint_problem(10, "auto", None)
    default = restart_setting(None, DEFAULT_A3_RESTARTS, 10, "auto", None)
    assert default.restarts == 0 and "trainer.default_local_dir is not set" in default.note
    assert restart_setting(1, DEFAULT_A3_RESTARTS, 10, "auto", None).refusal.startswith("--max-restarts 1: trainer.")
