"""Symbolic equivalence through math-verify (sympy + latex2sympy2_extended).

Runs only inside guarded worker processes (see `grading_worker`): math-verify's own timeouts use
`signal.alarm`, which works only in a main thread and cannot interrupt long C-level integer
operations, so they are switched off here and the worker's caller enforces the deadline instead.
"""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=1)
def _math_verify():
    # Imported on first use: the trainer-side process only needs the fast path and never pays for sympy.
    import math_verify

    gold_config = (math_verify.LatexExtractionConfig(),)
    pred_config = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
    return math_verify, gold_config, pred_config


def symbolic_equal(pred: str, truth: str) -> bool:
    """Whether two canonical answers are mathematically equal according to math-verify."""
    math_verify, gold_config, pred_config = _math_verify()
    # Wrapping in \boxed{} makes math-verify take the whole string as one answer, as verl's own
    # math-verify integration does for ground truths.
    gold = math_verify.parse("\\boxed{" + truth + "}", gold_config, parsing_timeout=None)
    target = math_verify.parse("\\boxed{" + pred + "}", pred_config, parsing_timeout=None)
    if not gold or not target:
        return False
    return bool(math_verify.verify(gold, target, timeout_seconds=None))
