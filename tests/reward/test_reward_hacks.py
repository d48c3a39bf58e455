"""Reward hacks a policy finds within a few hundred steps (issue 17), each as a property or table test
that fails under the defect:

- a sub-expression of the ground truth (a bound or index of a sum, product, integral or limit, an
  exponent, a coefficient, one side of an equation) scoring 1;
- several alternatives (`x=1 or x=2`) scoring 1 for a single-valued truth;
- percent on both sides compared after dividing one side only;
- a fixed rounding that makes every value below 5e-7 equal to 0 and to each other, or any tolerance
  applied to exact numbers (checked by running the table against two mutants of the tolerance).
"""

from __future__ import annotations

import re
from fractions import Fraction
from math import comb

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_patches.reward import numbers
from verl_patches.reward.deepscaler import clear_caches, grade, grade_batch
from verl_patches.reward.normalize import parse_plain_number

# Symbolic checks of sums and integrals take sympy tens of milliseconds; be generous, this is correctness.
TIMEOUT_S = 10.0
_settings = settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def boxed(answer: str) -> str:
    return "<think>work it out</think> The answer is \\boxed{" + answer + "}."


def latex_value(value: Fraction) -> str:
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


# --- sub-expressions -----------------------------------------------------------------------------------


def _groups(text: str) -> list[str]:
    """Contents of every {...} group, nested ones included."""
    found, stack = [], []
    for i, ch in enumerate(text):
        if ch == "{" and (i == 0 or text[i - 1] != "\\"):
            stack.append(i)
        elif ch == "}" and stack and text[i - 1] != "\\":
            found.append(text[stack.pop() + 1 : i])
    return found


def subexpressions(truth: str) -> set[str]:
    """Every part of a ground truth a policy could box instead of the whole: literals, groups, sides of '='."""
    parts = set(re.findall(r"\d+", truth)) | set(_groups(truth))
    for piece in [truth, *_groups(truth)]:
        sides = piece.split("=")
        if len(sides) > 1:
            parts |= set(sides)
    # The argument of an unbraced sub/superscript: `x^2` -> `2`, `\log_2` -> `2`.
    parts |= set(re.findall(r"[_^]([A-Za-z0-9])", truth))
    return {p.strip() for p in parts if p.strip() and p.strip() != truth}


def _sum(draw) -> tuple[str, Fraction | None]:
    a = draw(st.integers(0, 3))
    b = draw(st.integers(a + 1, a + 6))
    p = draw(st.integers(1, 3))
    return f"\\sum_{{k={a}}}^{{{b}}} k^{{{p}}}", Fraction(sum(k**p for k in range(a, b + 1)))


def _product(draw) -> tuple[str, Fraction | None]:
    a = draw(st.integers(1, 3))
    b = draw(st.integers(a + 1, a + 4))
    value = 1
    for i in range(a, b + 1):
        value *= i
    return f"\\prod_{{i={a}}}^{{{b}}} i", Fraction(value)


def _integral(draw) -> tuple[str, Fraction | None]:
    a = draw(st.integers(0, 3))
    b = draw(st.integers(a + 1, a + 4))
    c = draw(st.integers(2, 5))
    p = draw(st.integers(1, 3))
    return f"\\int_{{{a}}}^{{{b}}} {c} x^{{{p}}}\\,dx", Fraction(c * (b ** (p + 1) - a ** (p + 1)), p + 1)


def _limit(draw) -> tuple[str, Fraction | None]:
    a = draw(st.integers(1, 6))
    c = draw(st.integers(1, 9))
    return f"\\lim_{{x \\to {a}}} (x^{{2}} + {c})", Fraction(a * a + c)


def _power(draw) -> tuple[str, Fraction | None]:
    a = draw(st.integers(2, 9))
    b = draw(st.integers(2, 6))
    return f"{a}^{{{b}}}", Fraction(a**b)


def _binomial(draw) -> tuple[str, Fraction | None]:
    n = draw(st.integers(4, 12))
    k = draw(st.integers(2, n - 2))
    return f"\\binom{{{n}}}{{{k}}}", Fraction(comb(n, k))


def _logarithm(draw) -> tuple[str, Fraction | None]:
    base = draw(st.integers(2, 5))
    k = draw(st.integers(2, 5))
    return f"\\log_{{{base}}} {base**k}", Fraction(k)


def _equation(draw) -> tuple[str, Fraction | None]:
    c1, c2, c3 = draw(st.integers(2, 9)), draw(st.integers(2, 9)), draw(st.integers(10, 60))
    return f"{c1}x + {c2}y = {c3}", None


def _scaled_root(draw) -> tuple[str, Fraction | None]:
    c = draw(st.integers(2, 9))
    n = draw(st.sampled_from([2, 3, 5, 6, 7, 10]))
    return f"{c}\\sqrt{{{n}}}", None


FAMILIES = {
    f.__name__.strip("_"): f
    for f in (_sum, _product, _integral, _limit, _power, _binomial, _logarithm, _equation, _scaled_root)
}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_sub_expression_of_the_ground_truth_scores_one(pool, family):
    @_settings
    @given(data=st.data())
    def check(data):
        truth, value = FAMILIES[family](data.draw)
        parts = sorted(subexpressions(truth))
        assert parts, truth
        # A part that happens to have the truth's value (an integral's bound equal to its value) is right.
        wrong = [
            p for p in parts if value is None or (parse_plain_number(p) is None or parse_plain_number(p).value != value)
        ]
        responses = [boxed(p) for p in wrong]
        if value is not None:
            responses.append(boxed(latex_value(value)))
        grades = grade_batch(responses, [truth] * len(responses), timeout_s=TIMEOUT_S, pool=pool)
        scored = [(p, g.reason.value) for p, g in zip(wrong, grades) if g.score != 0.0]
        assert not scored, f"parts of {truth!r} scored 1: {scored}"
        if value is not None:
            assert grades[-1].score == 1.0, (truth, latex_value(value), grades[-1].reason)

    clear_caches()
    check()


SUB_EXPRESSION_TABLE = [
    # (answer, ground truth): each answer is a part of the truth and must score 0.
    ("1", "\\sum_{k=1}^{5} k^2"),
    ("5", "\\sum_{k=1}^{5} k^2"),
    ("k^2", "\\sum_{k=1}^{5} k^2"),
    ("k=1", "\\sum_{k=1}^{5} k^2"),
    ("1", "\\prod_{i=1}^{4} i"),
    ("4", "\\prod_{i=1}^{4} i"),
    ("1", "\\int_0^1 x^2\\,dx"),
    ("x^2", "\\int_0^1 x^2\\,dx"),
    ("2", "\\lim_{x\\to 2} (x^2+1)"),
    ("\\infty", "\\lim_{n\\to\\infty} (1+1/n)^n"),
    ("10", "2^{10}"),
    ("2", "2^{10}"),
    ("3", "3xy^2"),
    ("3", "3 xy^2"),
    ("xy^2", "3 xy^2"),
    ("25", "x^2+y^2=25"),
    ("x^2+y^2", "x^2+y^2=25"),
    ("3", "x_1+x_2=3"),
    ("12", "2x + 3y = 12"),
    ("y", "2x+1=y"),
    ("2x+1", "2x+1=y"),
    ("1", "x=1, y=2"),
    ("2", "x=1, y=2"),
    ("x = 1", "x=1, y=2"),
    ("y = 2", "x=1, y=2"),
    ("5", "5\\sqrt{2}"),
    ("2", "5\\sqrt{2}"),
    ("10", "\\binom{10}{3}"),
    ("32", "\\log_{2} 32"),
    ("1", "\\sum_{n=1}^{10} n"),
    ("1", "\\sum\\limits_{k=1}^{5} k^2"),
    ("0", "\\int\\limits_0^1 x\\,dx"),
    ("0", "\\lim\\limits_{x\\to 0} \\frac{\\sin x}{x}"),
    ("3", "\\sqrt[3]{5}"),
    ("4", "f(4) = 7"),
    ("n", "\\sum_{i=1}^{n} i"),
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("answer, truth", SUB_EXPRESSION_TABLE)
def test_sub_expression_table(pool, answer, truth):
    result = grade(boxed(answer), truth, timeout_s=TIMEOUT_S, pool=pool)
    assert result.score == 0.0, result.reason


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "answer, truth",
    [
        ("55", "\\sum_{k=1}^{5} k^2"),  # the whole, now that the `=` inside `_{k=1}` is not an assignment
        ("55", "\\sum_{n=1}^{10} n"),
        ("24", "\\prod_{i=1}^{4} i"),
        ("x^2+y^2=25", "x^2+y^2=25"),
        ("y^2 + x^2 = 25", "x^2+y^2=25"),
        ("3", "x = 3"),
        ("3", "f(x) = 3"),
        ("5", "a_1 = 5"),
        ("2x+1", "y = 2x+1"),
        ("y = 2x+1", "2x+1=y"),  # compared as an equation, since the truth is one
        ("55", "\\sum\\limits_{k=1}^{5} k^2"),
        ("\\frac12", "\\int\\limits_0^1 x\\,dx"),
        ("7", "f(4) = 7"),
        ("x = 1, y = 2", "x=1, y=2"),
        ("(1, 2)", "x \\in (1, 2)"),
    ],
)
def test_the_whole_still_scores_one(pool, answer, truth):
    result = grade(boxed(answer), truth, timeout_s=TIMEOUT_S, pool=pool)
    assert result.score == 1.0, result.reason


# --- hedging ----------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, database=None)
@given(
    a=st.integers(-50, 50),
    b=st.integers(-50, 50),
    style=st.sampled_from(
        [
            "x = {a} \\text{ or } x = {b}",
            "{a} \\text{ or } {b}",
            "x={a} or x={b}",
            "{a}, {b}",
            "{a} \\text{ and } {b}",
            "x_1 = {a}, x_2 = {b}",
            "x = {a}, {b}",
        ]
    ),
)
def test_alternatives_never_score_for_a_single_value(a, b, style):
    if a == b:
        return
    answer = style.replace("{a}", str(a)).replace("{b}", str(b))
    for truth in (str(a), str(b), f"x = {b}"):
        assert grade(boxed(answer), truth).score == 0.0, (answer, truth)


# --- percent ----------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, database=None)
@given(
    value=st.fractions(min_value=Fraction(1, 8), max_value=1000, max_denominator=8),
    shift=st.sampled_from([100, Fraction(1, 100)]),
)
def test_percent_on_both_sides_compares_the_values(value, shift):
    """`50%` is not `0.5%`: the old rule divided one side by 100 and compared."""
    other = value * shift
    assert grade(boxed(latex_value(value) + "\\%"), latex_value(other) + "\\%").score == 0.0
    assert grade(boxed(latex_value(value) + "\\%"), latex_value(value) + "\\%").score == 1.0
    # One side only: the percent may be read as v or v/100.
    assert grade(boxed(latex_value(value) + "\\%"), latex_value(value)).score == 1.0
    assert grade(boxed(latex_value(value) + "\\%"), latex_value(value / 100)).score == 1.0
    assert grade(boxed(latex_value(value / 100)), latex_value(value) + "\\%").score == 1.0


@pytest.mark.parametrize(
    "answer, truth, expected",
    [
        ("50\\%", "0.5\\%", 0.0),
        ("0.5\\%", "50\\%", 0.0),
        ("2.5\\%", "25\\%", 0.0),
        ("50\\%", "50%", 1.0),
        ("50 percent", "50\\%", 1.0),
        ("50\\%", "\\frac{1}{2}", 1.0),
        ("50\\%", "50", 1.0),
        ("0.5", "50\\%", 1.0),
        ("5\\%", "0.5", 0.0),
    ],
)
def test_percent_table(answer, truth, expected):
    assert grade(boxed(answer), truth).score == expected


# --- tolerance: decimals by their written precision, exact numbers exactly ----------------------------

# Exact numbers that differ only beyond the sixth decimal or by one part in a million: all wrong.
EXACT_NEAR_MISSES = [
    ("\\frac{1}{3000001}", "\\frac{1}{3000000}"),
    ("\\frac{1}{10^{7}}", "0"),
    ("1\\times10^{-7}", "0"),
    ("1\\times10^{-7}", "2\\times10^{-7}"),
    ("\\frac{1}{20000000}", "\\frac{1}{40000000}"),
    ("10000001", "10000000"),
    ("123456789", "123456788"),
    ("\\frac{1000001}{1000000}", "1"),
    ("\\frac{333333}{1000000}", "\\frac{1}{3}"),
    ("\\frac{2333333}{1000000}", "\\frac{7}{3}"),
    ("0.\\overline{3}", "\\frac{333333}{1000000}"),
]

DECIMAL_CASES = [
    # (answer, truth, expected): a decimal stands for the values it is a rounding of, to ~6 significant digits.
    ("0.333333", "\\frac{1}{3}", 1.0),
    ("0.3333333", "\\frac{1}{3}", 1.0),
    ("0.166667", "\\frac{1}{6}", 1.0),
    ("0.142857", "\\frac{1}{7}", 1.0),
    ("0.666667", "\\frac{2}{3}", 1.0),
    ("0.666666", "\\frac{2}{3}", 0.0),  # truncated, not rounded
    ("0.3333", "\\frac{1}{3}", 0.0),
    ("0.33333", "\\frac{1}{3}", 0.0),
    ("0.0000001", "0", 0.0),
    ("0.0000001", "0.0000002", 0.0),
    ("0.0000004", "0.0000001", 0.0),
    ("0.00000049", "0", 0.0),
    ("0.0", "0.0000001", 0.0),
    ("1.0e-7", "0", 0.0),
    ("1234568.0", "1234567", 0.0),
    ("1234567.3", "1234567", 0.0),
    ("1234567.0", "1234567", 1.0),
    ("1.2345671e-7", "\\frac{12345671}{10^{14}}", 1.0),
    ("2.0e-9", "2\\times10^{-9}", 1.0),
    ("0.000000100000", "1\\times10^{-7}", 1.0),
    # Decimals against symbolic truths: math-verify's own 6-place rounding is checked again.
    ("0.0", "\\frac{1}{2^{30}}", 0.0),
    ("0.000000001", "\\frac{1}{2^{30}}", 0.0),
    ("9.313226e-10", "\\frac{1}{2^{30}}", 1.0),
    ("0.0000001", "\\frac{1}{\\pi}\\cdot 10^{-7}", 0.0),
    ("3.141593", "\\pi", 1.0),
    ("3.14159", "\\pi", 1.0),  # six significant digits, correctly rounded
    ("3.1416", "\\pi", 0.0),
    ("3.14158", "\\pi", 0.0),
    ("1.414214", "\\sqrt{2}", 1.0),
    ("1.41", "\\sqrt{2}", 0.0),
]


@pytest.mark.parametrize("answer, truth", EXACT_NEAR_MISSES)
def test_exact_numbers_compare_exactly(answer, truth):
    assert grade(boxed(answer), truth).score == 0.0
    assert grade(boxed(truth), answer).score == 0.0


@pytest.mark.timeout(300)
@pytest.mark.parametrize("answer, truth, expected", DECIMAL_CASES)
def test_decimals_compare_to_their_written_precision(pool, answer, truth, expected):
    assert grade(boxed(answer), truth, timeout_s=TIMEOUT_S, pool=pool).score == expected


@settings(max_examples=200, deadline=None, database=None)
@given(a=st.integers(1, 10**6), b=st.integers(1, 10**6), scale=st.integers(7, 12))
def test_tiny_decimals_are_neither_zero_nor_each_other(a, b, scale):
    """Values below 5e-7 written as decimals: equal only when equal."""
    x, y = Fraction(a, 10 ** (scale + 6)), Fraction(b, 10 ** (scale + 6))
    text = lambda v: f"{v.numerator / v.denominator:.{scale + 6}f}"  # noqa: E731
    assert grade(boxed(text(x)), text(y)).score == (1.0 if a == b else 0.0)
    assert grade(boxed(text(x)), "0").score == 0.0


@settings(max_examples=200, deadline=None, database=None)
@given(
    value=st.fractions(min_value=-(10**6), max_value=10**6, max_denominator=10**7),
    delta=st.fractions(min_value=Fraction(1, 10**12), max_value=Fraction(1, 10**6), max_denominator=10**12),
)
def test_exact_values_never_get_a_tolerance(value, delta):
    assert grade(boxed(latex_value(value + delta)), latex_value(value)).score == 0.0


def _six_decimal_rounding_for_everything(number):
    # The old behaviour: every value rounded to 6 places, exact or not.
    return Fraction(1, 2 * 10**6)


def _relative_tolerance_for_everything(number):
    return abs(number.value) / 10**6 if number.value else None


@pytest.mark.parametrize("mutant", [_six_decimal_rounding_for_everything, _relative_tolerance_for_everything])
def test_table_catches_a_tolerance_applied_to_exact_numbers(monkeypatch, mutant):
    """Mutation test: with a tolerance for exact numbers, the EXACT_NEAR_MISSES table must fail."""
    assert all(grade(boxed(a), t).score == 0.0 for a, t in EXACT_NEAR_MISSES)
    monkeypatch.setattr(numbers, "tolerance", mutant)
    flipped = [(a, t) for a, t in EXACT_NEAR_MISSES if grade(boxed(a), t).score == 1.0]
    assert flipped, "the exact-number table did not notice a tolerance applied to exact numbers"


def test_decimal_table_catches_a_missing_tolerance(monkeypatch):
    """The other direction: with no tolerance at all, the decimal table must fail too."""
    monkeypatch.setattr(numbers, "tolerance", lambda number: None)
    fast = [(a, t) for a, t, e in DECIMAL_CASES if e == 1.0 and parse_plain_number(t) is not None]
    assert any(grade(boxed(a), t).score == 0.0 for a, t in fast)
