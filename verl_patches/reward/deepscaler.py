"""The deepscaler reward: strict 0/1 on the final answer, equivalence-aware, time-bounded.

Pipeline per response: extract the committed answer under the format rule (`extract`; by default
DeepScaleR's and R1-Zero's: `</think>` and then a box, or 0), canonicalise both sides and try
the fast exact/numeric comparison (`normalize`), refuse intractable input (`limits`), and only then
ask math-verify in a guarded worker process (`guarded_pool`) under the remaining time budget.
Nothing here raises into the trainer: any failure scores 0 and is counted in `reward_stats()`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from verl_patches.reward.extract import AnswerSource, FormatRule, extract_final_answer, parse_format_rule
from verl_patches.reward.grading_worker import Verdict
from verl_patches.reward.guarded_pool import GuardedPool, PoolConfig, default_pool
from verl_patches.reward.limits import SymbolicLimits, symbolic_refusal
from verl_patches.reward.normalize import CanonicalAnswer, canonical_answer, fast_verdict
from verl_patches.reward.solutions import is_equation

logger = logging.getLogger(__name__)

DATA_SOURCE = "deepscaler"
DEFAULT_TIMEOUT_S = 1.0
# A committed answer longer than this is only compared as an exact string: no real answer is that long.
MAX_ANSWER_CHARS = 2000
_SYMBOLIC_CACHE_SIZE = 65536
_DEFAULT_LIMITS = SymbolicLimits()  # frozen, so one shared instance is a safe default argument


class GradeReason(str, enum.Enum):
    EQUAL_FAST = "equal_fast"
    EQUAL_SYMBOLIC = "equal_symbolic"
    NOT_EQUAL = "not_equal"
    NO_ANSWER = "no_answer"
    NO_THINK_CLOSE = "no_think_close"
    UNCLOSED_THINK = "unclosed_think"
    MALFORMED_BOX = "malformed_box"
    TOO_COMPLEX = "too_complex"
    TIMEOUT = "timeout"
    ERROR = "error"
    BAD_GROUND_TRUTH = "bad_ground_truth"


@dataclass(frozen=True)
class Grade:
    score: float
    reason: GradeReason


_NO_ANSWER_REASONS = {
    AnswerSource.NONE: GradeReason.NO_ANSWER,
    AnswerSource.NO_THINK_CLOSE: GradeReason.NO_THINK_CLOSE,
    AnswerSource.UNCLOSED_THINK: GradeReason.UNCLOSED_THINK,
    AnswerSource.MALFORMED_BOX: GradeReason.MALFORMED_BOX,
}


class RewardCounters:
    """Per-process counts of grading outcomes; timeouts in particular must be visible."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def add(self, reason: GradeReason) -> None:
        with self._lock:
            self._counts["calls"] += 1
            self._counts[reason.value] += 1
            timeouts = self._counts[GradeReason.TIMEOUT.value]
        if reason is GradeReason.TIMEOUT and (timeouts & (timeouts - 1)) == 0:
            logger.warning("deepscaler reward: %d answer(s) timed out so far and scored 0", timeouts)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()


COUNTERS = RewardCounters()


def reward_stats() -> dict[str, int]:
    """Counts of grading outcomes in this process (`calls`, `timeout`, `too_complex`, ...)."""
    return COUNTERS.snapshot()


class _VerdictCache:
    """(pred, truth) -> decided symbolic verdict; the 16 samples of a prompt often share an answer."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._items: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def get(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def put(self, key: tuple[str, str], value: bool) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)


_SYMBOLIC_CACHE = _VerdictCache(_SYMBOLIC_CACHE_SIZE)


def clear_caches() -> None:
    """Forget remembered symbolic verdicts (benchmarks and tests measure the uncached path)."""
    _SYMBOLIC_CACHE.clear()


@lru_cache(maxsize=8192)
def _canonical_truth(ground_truth: str) -> CanonicalAnswer:
    return canonical_answer(ground_truth)


def _as_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def prejudge(
    solution: Any,
    ground_truth: Any,
    limits: SymbolicLimits = _DEFAULT_LIMITS,
    format_rule: FormatRule = FormatRule.STRICT,
) -> Grade | tuple[str, str]:
    """A final Grade, or the canonical (pred, truth) pair that needs the symbolic check."""
    truth_text = _as_text(ground_truth)
    if truth_text is None or not truth_text.strip():
        return Grade(0.0, GradeReason.BAD_GROUND_TRUTH)
    if not isinstance(solution, str):
        return Grade(0.0, GradeReason.NO_ANSWER)
    extracted = extract_final_answer(solution, format_rule)
    if extracted.text is None:
        return Grade(0.0, _NO_ANSWER_REASONS[extracted.source])
    if len(extracted.text) > MAX_ANSWER_CHARS:
        same = extracted.text.strip() == truth_text.strip()
        return Grade(1.0, GradeReason.EQUAL_FAST) if same else Grade(0.0, GradeReason.TOO_COMPLEX)
    truth = _canonical_truth(truth_text)
    pred = canonical_answer(extracted.text, keep_assignment=is_equation(truth.text))
    verdict = fast_verdict(pred, truth)
    if verdict is not None:
        return Grade(1.0, GradeReason.EQUAL_FAST) if verdict else Grade(0.0, GradeReason.NOT_EQUAL)
    if symbolic_refusal(pred.text, limits) or symbolic_refusal(truth.text, limits):
        return Grade(0.0, GradeReason.TOO_COMPLEX)
    return pred.text, truth.text


def _grade_from_verdict(verdict: Verdict) -> Grade:
    if verdict is Verdict.EQUAL:
        return Grade(1.0, GradeReason.EQUAL_SYMBOLIC)
    if verdict is Verdict.NOT_EQUAL:
        return Grade(0.0, GradeReason.NOT_EQUAL)
    if verdict is Verdict.TIMEOUT:
        return Grade(0.0, GradeReason.TIMEOUT)
    return Grade(0.0, GradeReason.ERROR)


def _pool(num_workers: int | None, memory_limit_mb: int | None) -> GuardedPool:
    defaults = PoolConfig()
    return default_pool(
        PoolConfig(
            max_workers=num_workers or defaults.max_workers,
            memory_limit_mb=memory_limit_mb if memory_limit_mb is not None else defaults.memory_limit_mb,
        )
    )


def _check_timeout(timeout_s: float) -> float:
    timeout_s = float(timeout_s)
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    return timeout_s


def grade(
    solution: Any,
    ground_truth: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    pool: GuardedPool | None = None,
    format_rule: FormatRule | str = FormatRule.STRICT,
) -> Grade:
    """Grade one response within timeout_s; never raises for any response or ground truth.

    Not counted in timeout_s: starting a grading worker process, once per worker (about a second for
    the first symbolic check in a process; `GuardedPool.warm_up` moves it earlier). A non-positive
    timeout_s or an unknown format_rule is a configuration error and raises ValueError.
    """
    timeout_s = _check_timeout(timeout_s)
    rule = parse_format_rule(format_rule)
    started = time.monotonic()
    try:
        pre = prejudge(solution, ground_truth, format_rule=rule)
        if isinstance(pre, tuple):
            cached = _SYMBOLIC_CACHE.get(pre)
            if cached is not None:
                pre = Grade(1.0, GradeReason.EQUAL_SYMBOLIC) if cached else Grade(0.0, GradeReason.NOT_EQUAL)
        if isinstance(pre, tuple):
            remaining = timeout_s - (time.monotonic() - started)
            verdict = (pool or _pool(None, None)).judge(pre[0], pre[1], remaining) if remaining > 0 else Verdict.TIMEOUT
            if verdict in (Verdict.EQUAL, Verdict.NOT_EQUAL):
                _SYMBOLIC_CACHE.put(pre, verdict is Verdict.EQUAL)
            result = _grade_from_verdict(verdict)
        else:
            result = pre
    except Exception:  # the trainer must never see a reward exception
        logger.exception("deepscaler reward failed; the answer scores 0")
        result = Grade(0.0, GradeReason.ERROR)
    COUNTERS.add(result.reason)
    return result


def grade_batch(
    solutions: Sequence[Any],
    ground_truths: Sequence[Any],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    pool: GuardedPool | None = None,
    progress: bool = False,
    format_rule: FormatRule | str = FormatRule.STRICT,
) -> list[Grade]:
    """Grade a training step's responses: fast path here, symbolic checks across worker processes.

    Each distinct (answer, ground truth) pair is judged once, within timeout_s.
    """
    timeout_s = _check_timeout(timeout_s)
    rule = parse_format_rule(format_rule)
    if len(solutions) != len(ground_truths):
        raise ValueError(f"{len(solutions)} solutions but {len(ground_truths)} ground truths")
    grades: list[Grade | None] = [None] * len(solutions)
    waiting: dict[tuple[str, str], list[int]] = {}
    for index, (solution, truth) in enumerate(zip(solutions, ground_truths)):
        try:
            pre = prejudge(solution, truth, format_rule=rule)
        except Exception:
            logger.exception("deepscaler reward failed on item %d; it scores 0", index)
            pre = Grade(0.0, GradeReason.ERROR)
        if isinstance(pre, tuple):
            cached = _SYMBOLIC_CACHE.get(pre)
            if cached is None:
                waiting.setdefault(pre, []).append(index)
                continue
            pre = Grade(1.0, GradeReason.EQUAL_SYMBOLIC) if cached else Grade(0.0, GradeReason.NOT_EQUAL)
        grades[index] = pre
    if waiting:
        pairs = list(waiting)
        try:
            verdicts = (pool or _pool(None, None)).judge_many(pairs, timeout_s, progress=progress)
        except Exception:
            logger.exception("deepscaler reward: symbolic batch failed; %d answers score 0", len(pairs))
            verdicts = [Verdict.ERROR] * len(pairs)
        for pair, verdict in zip(pairs, verdicts):
            if verdict in (Verdict.EQUAL, Verdict.NOT_EQUAL):
                _SYMBOLIC_CACHE.put(pair, verdict is Verdict.EQUAL)
            for index in waiting[pair]:
                grades[index] = _grade_from_verdict(verdict)
    final = [g if g is not None else Grade(0.0, GradeReason.ERROR) for g in grades]
    for g in final:
        COUNTERS.add(g.reason)
    return final


def compute_score(
    data_source: Any,
    solution_str: Any,
    ground_truth: Any,
    extra_info: Any = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    num_workers: int | None = None,
    memory_limit_mb: int | None = None,
    format_rule: str = FormatRule.STRICT.value,
) -> float:
    """verl `custom_reward_function` signature: 1.0 if the final answer equals ground_truth, else 0.0."""
    rule = parse_format_rule(format_rule)
    pool = _pool(num_workers, memory_limit_mb)
    return grade(solution_str, ground_truth, timeout_s=timeout_s, pool=pool, format_rule=rule).score


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[Any],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    num_workers: int | None = None,
    memory_limit_mb: int | None = None,
    format_rule: str = FormatRule.STRICT.value,
) -> list[float]:
    """verl `BatchRewardManager` signature: one 0.0/1.0 score per response."""
    rule = parse_format_rule(format_rule)
    pool = _pool(num_workers, memory_limit_mb)
    return [
        g.score for g in grade_batch(solution_strs, ground_truths, timeout_s=timeout_s, pool=pool, format_rule=rule)
    ]
