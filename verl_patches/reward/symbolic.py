"""Symbolic equivalence through math-verify (sympy + latex2sympy2_extended).

Runs only inside guarded worker processes (see `grading_worker`): math-verify's own timeouts use
`signal.alarm`, which works only in a main thread and cannot interrupt long C-level integer
operations, so they are switched off here and the worker's caller enforces the deadline instead.

math-verify compares a decimal with anything by rounding both to 6 places, which makes every value
below 5e-7 equal to 0 and to each other. So when one side is a plain decimal and the other has a
numeric value, our rule decides instead (`numbers.stands_for`: the decimal is that value rounded to
the places written, to a relative precision); math-verify decides everything else.
"""

from __future__ import annotations

from fractions import Fraction
from functools import lru_cache
from typing import Any

from verl_patches.reward.numbers import parse_plain_number, stands_for

# Digits of the numeric value a decimal is checked against; far beyond any precision a decimal claims.
_CHECK_DIGITS = 40
# Polynomials up to this degree are compared by expanding their difference.
_MAX_EXPANDED_DEGREE = 32


@lru_cache(maxsize=1)
def _math_verify():
    # Imported on first use: the trainer-side process only needs the fast path and never pays for sympy.
    import math_verify

    gold_config = (math_verify.LatexExtractionConfig(),)
    pred_config = (math_verify.LatexExtractionConfig(), math_verify.ExprExtractionConfig())
    return math_verify, gold_config, pred_config


def _numeric_value(expr: Any) -> Fraction | None:
    """The real value of a parsed constant expression, to `_CHECK_DIGITS` digits; None if it has none."""
    try:
        if not getattr(expr, "is_number", False):
            return None
        value = expr.doit().evalf(_CHECK_DIGITS)
        if value.is_real is not True or value.is_finite is not True:
            return None
        return Fraction(str(value))
    except Exception:  # sympy raises many types for expressions it cannot evaluate
        return None


def _decimal_verdict(pred: str, truth: str, target: list, gold: list) -> bool | None:
    """Our verdict when one side is a plain decimal and the other a number; None otherwise."""
    for text, other in ((pred, gold), (truth, target)):
        number = parse_plain_number(text)
        if number is None or not number.inexact or not other:
            continue
        value = _numeric_value(other[0])
        if value is not None:
            return stands_for(number, value)
    return None


def _polynomial_verdict(a: Any, b: Any) -> bool | None:
    """Equality of two polynomials with exact coefficients: their difference expands to 0.

    The same verdict math-verify reaches through simplify(), at a fraction of the cost (simplify of
    `(x+3)^2 - (x^2+6x+9)` takes sympy hundreds of milliseconds). None when either side is not such
    a polynomial, or has a degree above `_MAX_EXPANDED_DEGREE`.
    """
    # lazy: only this path needs sympy; importing this module stays light
    from sympy import Expr, Float, Pow, Symbol

    try:
        if not isinstance(a, Expr) or not isinstance(b, Expr) or isinstance(a, Symbol) or isinstance(b, Symbol):
            return None
        symbols = a.free_symbols | b.free_symbols
        if not symbols or a.atoms(Float) or b.atoms(Float):
            return None
        for power in a.atoms(Pow) | b.atoms(Pow):
            if not power.exp.is_Integer or abs(int(power.exp)) > _MAX_EXPANDED_DEGREE:
                return None
        if not (a.is_polynomial(*symbols) and b.is_polynomial(*symbols)):
            return None
        return (a - b).expand() == 0
    except Exception:  # anything sympy cannot do here is left to math-verify
        return None


def symbolic_equal(pred: str, truth: str) -> bool:
    """Whether two canonical answers are mathematically equal according to math-verify."""
    math_verify, gold_config, pred_config = _math_verify()
    # Wrapping in \boxed{} makes math-verify take the whole string as one answer, as verl's own
    # math-verify integration does for ground truths.
    gold = math_verify.parse("\\boxed{" + truth + "}", gold_config, parsing_timeout=None)
    target = math_verify.parse("\\boxed{" + pred + "}", pred_config, parsing_timeout=None)
    decided = _decimal_verdict(pred, truth, target, gold)
    if decided is not None:
        return decided
    if not gold or not target:
        return False
    polynomial = _polynomial_verdict(gold[0], target[0])
    if polynomial is not None:
        return polynomial
    return bool(math_verify.verify(gold, target, timeout_seconds=None))
