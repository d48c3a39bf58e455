"""Each reward call is bounded in time, from any thread, and never raises into the trainer."""

from __future__ import annotations

import os
import threading
import time

import pytest

from verl_patches.reward.deepscaler import GradeReason, clear_caches, grade, grade_batch, reward_stats
from verl_patches.reward.grading_worker import Verdict
from verl_patches.reward.guarded_pool import GuardedPool, PoolConfig

# Passes the cheap pre-checks but takes sympy about 12 s on these machines when unbounded.
SLOW_PRED, SLOW_TRUTH = "(x+1)^{1000}", "x^{1000}+1"
# Other sessions share these 2 CPU cores: allow this much scheduling noise on top of a budget.
SLACK_S = 0.6


def response(answer: str) -> str:
    return "<think>expand and compare</think> The answer is \\boxed{" + answer + "}"


@pytest.fixture(scope="module")
def pool():
    pool = GuardedPool(PoolConfig(max_workers=2))
    pool.warm_up(2)
    yield pool
    pool.close()


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_caches()


@pytest.mark.timeout(60)
def test_slow_symbolic_check_is_stopped_at_the_budget_and_the_worker_survives(pool):
    started = time.monotonic()
    verdict = pool.judge(SLOW_PRED, SLOW_TRUTH, timeout_s=0.5)
    elapsed = time.monotonic() - started
    assert verdict is Verdict.TIMEOUT
    assert elapsed < 0.5 + SLACK_S
    # The worker stopped itself (soft deadline): the next check needs no restart and is right.
    started = time.monotonic()
    assert pool.judge("(x+1)^2", "x^2+2x+1", timeout_s=5.0) is Verdict.EQUAL
    assert time.monotonic() - started < 2.0


@pytest.mark.timeout(60)
def test_worker_that_ignores_its_own_timer_is_killed_at_the_hard_deadline():
    # soft_deadline_fraction > 1 leaves the worker's own timer beyond the deadline: only the kill
    # can stop it, as with C-level work that never returns to the interpreter.
    pool = GuardedPool(PoolConfig(max_workers=1, soft_deadline_fraction=50.0))
    try:
        pool.warm_up(1)
        (worker,) = pool._idle
        started = time.monotonic()
        assert pool.judge(SLOW_PRED, SLOW_TRUTH, timeout_s=0.5) is Verdict.TIMEOUT
        assert time.monotonic() - started < 0.5 + SLACK_S
        assert worker.process.poll() is not None  # killed and reaped
        with pytest.raises(ProcessLookupError):
            os.kill(worker.process.pid, 0)
        # A replacement was started at once and grades normally.
        assert pool.judge("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", timeout_s=5.0) is Verdict.EQUAL
    finally:
        pool.close()


@pytest.mark.timeout(60)
def test_grade_from_a_worker_thread_is_bounded_correct_and_counted(pool):
    before = reward_stats().get(GradeReason.TIMEOUT.value, 0)
    results: dict[str, object] = {}

    def run() -> None:
        started = time.monotonic()
        results["slow"] = grade(response(SLOW_PRED), SLOW_TRUTH, timeout_s=0.5, pool=pool)
        results["slow_elapsed"] = time.monotonic() - started
        results["easy"] = grade(response("2\\sqrt{3}"), "\\sqrt{12}", timeout_s=5.0, pool=pool)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    assert results["slow"].score == 0.0 and results["slow"].reason is GradeReason.TIMEOUT
    assert results["slow_elapsed"] < 0.5 + SLACK_S
    assert results["easy"].score == 1.0
    assert reward_stats()[GradeReason.TIMEOUT.value] == before + 1


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "answer_text",
    [
        response("2^{10^{10}}"),
        response("10^{100000000}"),
        response("9999999!"),
        response("{" * 10000 + "1" + "}" * 10000),
        response("\\frac{" * 3000 + "1"),
        response("x" + "+x" * 50000),
        "<think>" + "a" * 100_000 + "</think> \\boxed{" + "7" * 100_000 + "}",
        "<think>" + "\\boxed{" * 30_000 + "</think>" + "\\boxed{" * 30_000,
        "the answer is " * 10_000,
        response(SLOW_PRED),
    ],
    ids=[
        "tower",
        "huge-power",
        "huge-factorial",
        "deep-braces",
        "unclosed-fracs",
        "long-sum",
        "100kB",
        "many-boxes",
        "many-markers",
        "slow-sympy",
    ],
)
def test_adversarial_answers_finish_within_the_budget(pool, answer_text):
    budget = 1.0
    started = time.monotonic()
    result = grade(answer_text, SLOW_TRUTH, timeout_s=budget, pool=pool)
    assert time.monotonic() - started < budget + SLACK_S
    assert result.score == 0.0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "solution, truth",
    [
        (None, "4"),
        (b"\\boxed{4}", "4"),
        (4, "4"),
        ("\\boxed{4}", None),
        ("\\boxed{4}", {"answer": 4}),
        ("\\boxed{4}", float("nan")),
        ("\\boxed{\ud800}", "4"),
        ("\\boxed{\x00}", "\x00\x00"),
        ("\\boxed{" + "\\" * 1001 + "}", "4"),
    ],
)
def test_grade_never_raises_on_junk(pool, solution, truth):
    result = grade(solution, truth, timeout_s=1.0, pool=pool)
    assert result.score in (0.0, 1.0)
    assert isinstance(result.score, float)


def test_numeric_ground_truth_is_read_as_text(pool):
    assert grade(response("4"), 4, pool=pool).score == 1.0
    assert grade(response("0.5"), 0.5, pool=pool).score == 1.0


@pytest.mark.timeout(120)
def test_batch_counts_timeouts_and_stays_bounded(pool):
    before = reward_stats().get(GradeReason.TIMEOUT.value, 0)
    slow = [response(f"(x+{k})^{{1000}}") for k in range(1, 5)]
    slow_truths = [f"x^{{1000}}+{k}" for k in range(1, 5)]
    easy = [response("2\\sqrt{3}"), response("(x+1)^2"), response("\\frac{3}{6}")] * 10
    easy_truths = ["\\sqrt{12}", "x^2+2x+1", "0.5"] * 10
    budget = 0.4
    started = time.monotonic()
    grades = grade_batch(slow + easy, slow_truths + easy_truths, timeout_s=budget, pool=pool)
    elapsed = time.monotonic() - started
    assert [g.reason for g in grades[:4]] == [GradeReason.TIMEOUT] * 4
    assert all(g.score == 1.0 for g in grades[4:])
    # 4 slow items over 2 workers take two budgets of wall time, plus the quick ones.
    assert elapsed < 2 * budget + 2 * SLACK_S + 1.0
    assert reward_stats()[GradeReason.TIMEOUT.value] == before + 4


def test_timeout_must_be_positive(pool):
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        grade(response("4"), "4", timeout_s=0, pool=pool)
