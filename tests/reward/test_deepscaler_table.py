"""A truth table for the deepscaler reward: every rule of issue 3 (H), vendor false positives, and
false negatives of naive string comparison. Each row: (response, ground truth, expected score under
the default strict format rule, tag).

Tags: `rule` (extraction/think rules), `format` (the R1-Zero format rule: 0 under `strict`; their
`relaxed` scores are in RELAXED), `vendor_fp` (the vendor's substring rule scores 1, the answer is
wrong), `naive_fn` (equivalent answers a string comparison rejects), `wrong` (near misses that must
score 0), `structure` (intervals, tuples, sets), `adversarial` (must stay 0 and fast).
"""

from __future__ import annotations

import pytest

from verl_patches.reward.deepscaler import clear_caches, grade, grade_batch
from verl_patches.reward.extract import last_boxed

T = "<think>Let me work through this carefully: 3 + 4 = 7, then 2 * 6 = 12.</think> "


def boxed(answer: str) -> str:
    return T + "The final answer is \\boxed{" + answer + "}."


CASES: list[tuple[str, str, float, str]] = [
    # --- which text is graded ------------------------------------------------------------------
    (T + "\\boxed{4}", "4", 1.0, "rule"),
    ("<think>maybe \\boxed{4}</think> \\boxed{5}", "4", 0.0, "rule"),
    ("<think>maybe \\boxed{5}</think> \\boxed{4}", "4", 1.0, "rule"),
    ("<think>I think it is 4", "4", 0.0, "rule"),
    ("<think>I think it is \\boxed{4}", "4", 0.0, "rule"),
    ("<think>the answer is 4</think>", "4", 0.0, "rule"),
    ("<think>the answer is 4</think> I am not sure.", "4", 0.0, "rule"),
    (T + "4", "4", 0.0, "rule"),
    ("\\boxed{4}", "4", 0.0, "format"),
    (T + "\\boxed{3} or maybe \\boxed{4}", "4", 1.0, "rule"),
    (T + "\\boxed{4} or maybe \\boxed{3}", "4", 0.0, "rule"),
    (T + "\\boxed 4", "4", 1.0, "rule"),
    (T + "$\\boxed 4$.", "4", 1.0, "rule"),
    (T + "\\fbox{4}", "4", 1.0, "rule"),
    (T + "The answer is 4.", "4", 0.0, "format"),
    (T + "Final answer: 4", "4", 0.0, "format"),
    (T + "**Final Answer:** 4", "4", 0.0, "format"),
    (T + "The answer is $\\frac{1}{2}$.", "\\frac12", 0.0, "format"),
    (T + "So the final answer is 3.5. I hope it is correct.", "\\frac{7}{2}", 0.0, "format"),
    ("The answer is \\boxed{4}.", "4", 0.0, "format"),
    ("I think it is 4", "4", 0.0, "format"),
    (T + "\\boxed{4", "4", 0.0, "rule"),
    (T + "\\boxed{}", "4", 0.0, "rule"),
    (T + "\\boxed{ 4 }", "4", 1.0, "rule"),
    ("<think>a</think></think> \\boxed{4}", "4", 1.0, "rule"),
    ("<think>a</think> \\boxed{4} <think>let me reconsider", "4", 0.0, "rule"),
    ("Sure! <think>a</think> \\boxed{4}", "4", 1.0, "rule"),
    (T + "$$\\boxed{4}$$", "4", 1.0, "rule"),
    (T + "\\[\\boxed{\\{1,2\\}}\\]", "\\{1,2\\}", 1.0, "rule"),
    (T + "\n\n**Answer**: \\boxed{4}", "4", 1.0, "rule"),
    (T + "The answer is not 5, it is 6.", "5", 0.0, "rule"),
    (T + "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0, "rule"),
    (T + "\\boxed{4}", "  4 ", 1.0, "rule"),
    (T + "I cannot solve this.", "4", 0.0, "rule"),
    ("", "4", 0.0, "rule"),
    (T + "\\boxed{4}", "", 0.0, "rule"),
    # --- the vendor's substring rule scores these 1 ---------------------------------------------
    (T + "\\boxed{3}", "2", 0.0, "vendor_fp"),
    (boxed("12"), "2", 0.0, "vendor_fp"),
    (boxed("21"), "1", 0.0, "vendor_fp"),
    (boxed("-2"), "2", 0.0, "vendor_fp"),
    (boxed("0.5"), "5", 0.0, "vendor_fp"),
    (boxed("\\frac{1}{3}"), "3", 0.0, "vendor_fp"),
    (boxed("3\\sqrt{2}"), "\\sqrt{2}", 0.0, "vendor_fp"),
    (boxed("x^2"), "x", 0.0, "vendor_fp"),
    (boxed("100"), "10", 0.0, "vendor_fp"),
    (boxed("(1,2)"), "1", 0.0, "vendor_fp"),
    (boxed("2024"), "202", 0.0, "vendor_fp"),
    ("<think>maybe 7</think> \\boxed{8}", "7", 0.0, "vendor_fp"),
    (boxed("5") + " 2", "2", 0.0, "vendor_fp"),
    (boxed("-1"), "1", 0.0, "vendor_fp"),
    (T + "2 is wrong, so \\boxed{4}", "2", 0.0, "vendor_fp"),
    (boxed("e^2"), "2", 0.0, "vendor_fp"),
    (boxed("\\frac{7}{12}"), "12", 0.0, "vendor_fp"),
    (boxed("3+4"), "4", 0.0, "vendor_fp"),
    ("<think>7</think> the answer is 8", "7", 0.0, "vendor_fp"),
    (boxed("120^\\circ"), "20", 0.0, "vendor_fp"),
    # --- equivalent forms a string comparison rejects -------------------------------------------
    (boxed("1,000"), "1000", 1.0, "naive_fn"),
    (boxed("1{,}000"), "1000", 1.0, "naive_fn"),
    (boxed("1\\,000"), "1000", 1.0, "naive_fn"),
    (boxed("12,345,678"), "12345678", 1.0, "naive_fn"),
    (boxed("10\\!000"), "10000", 1.0, "naive_fn"),
    (boxed("0.5"), "\\frac{1}{2}", 1.0, "naive_fn"),
    (boxed("\\dfrac{1}{2}"), "\\frac12", 1.0, "naive_fn"),
    (boxed("\\tfrac{1}{2}"), "1/2", 1.0, "naive_fn"),
    (boxed("1/2"), "0.5", 1.0, "naive_fn"),
    (boxed("\\frac{2}{4}"), "\\frac{1}{2}", 1.0, "naive_fn"),
    (boxed(".5"), "0.5", 1.0, "naive_fn"),
    (boxed("0.50"), "1/2", 1.0, "naive_fn"),
    (boxed("-\\frac{1}{2}"), "\\frac{-1}{2}", 1.0, "naive_fn"),
    (boxed("\\frac{-3}{4}"), "-0.75", 1.0, "naive_fn"),
    (boxed("\\frac{10}{4}"), "2.5", 1.0, "naive_fn"),
    (boxed("7.0"), "7", 1.0, "naive_fn"),
    (boxed("5.00"), "5", 1.0, "naive_fn"),
    (boxed("007"), "7", 1.0, "naive_fn"),
    (boxed("+7"), "7", 1.0, "naive_fn"),
    (boxed("\u22125"), "-5", 1.0, "naive_fn"),
    (boxed("30^\\circ"), "30", 1.0, "naive_fn"),
    (boxed("30^{\\circ}"), "30", 1.0, "naive_fn"),
    (boxed("30°"), "30", 1.0, "naive_fn"),
    (boxed("90"), "90^\\circ", 1.0, "naive_fn"),
    (boxed("25\\%"), "25", 1.0, "naive_fn"),
    (boxed("25\\%"), "0.25", 1.0, "naive_fn"),
    (boxed("25%"), "25\\%", 1.0, "naive_fn"),
    (boxed("5\\text{ cm}"), "5", 1.0, "naive_fn"),
    (boxed("5 \\text{cm}^2"), "5", 1.0, "naive_fn"),
    (boxed("12 \\mbox{ inches}"), "12", 1.0, "naive_fn"),
    (boxed("5 cm"), "5", 1.0, "naive_fn"),
    (boxed("\\text{12 cm}"), "12", 1.0, "naive_fn"),
    (boxed("5 dollars"), "5", 1.0, "naive_fn"),
    (boxed("\\$5"), "5", 1.0, "naive_fn"),
    (boxed("x = 3"), "3", 1.0, "naive_fn"),
    (boxed("x=3"), "3", 1.0, "naive_fn"),
    (boxed("3"), "x = 3", 1.0, "naive_fn"),
    (boxed("y = 2x+1"), "2x+1", 1.0, "naive_fn"),
    (boxed("\\text{Evelyn}"), "Evelyn", 1.0, "naive_fn"),
    (boxed("\\textbf{Evelyn}"), "Evelyn", 1.0, "naive_fn"),
    (boxed("C"), "\\text{(C)}", 1.0, "naive_fn"),
    (boxed("(C)"), "C", 1.0, "naive_fn"),
    (boxed("2\\sqrt{3}"), "\\sqrt{12}", 1.0, "naive_fn"),
    (boxed("\\sqrt3"), "\\sqrt{3}", 1.0, "naive_fn"),
    (boxed("2 \\sqrt 3"), "2\\sqrt{3}", 1.0, "naive_fn"),
    (boxed("\\dfrac{\\sqrt3}{2}"), "\\frac{\\sqrt{3}}{2}", 1.0, "naive_fn"),
    (boxed("\\frac{1}{\\sqrt{2}}"), "\\frac{\\sqrt{2}}{2}", 1.0, "naive_fn"),
    (boxed("\\sqrt[3]{2}"), "2^{1/3}", 1.0, "naive_fn"),
    (boxed("\\pi/2"), "\\frac{\\pi}{2}", 1.0, "naive_fn"),
    (boxed("0.5\\pi"), "\\frac{\\pi}{2}", 1.0, "naive_fn"),
    (boxed("\\dfrac{\\pi}{2}"), "\\frac{\\pi}{2}", 1.0, "naive_fn"),
    (boxed("2\\pi"), "2 \\pi", 1.0, "naive_fn"),
    (boxed("1.5\\times10^{3}"), "1500", 1.0, "naive_fn"),
    (boxed("1.5 \\times 10^3"), "1500", 1.0, "naive_fn"),
    (boxed("1.5e3"), "1500", 1.0, "naive_fn"),
    (boxed("3\\cdot 10^{-2}"), "0.03", 1.0, "naive_fn"),
    (boxed("2.5 \\times 10^{6}"), "2500000", 1.0, "naive_fn"),
    (boxed("1.0e-3"), "0.001", 1.0, "naive_fn"),
    (boxed("(x+1)^2"), "x^2+2x+1", 1.0, "naive_fn"),
    (boxed("x^2-1"), "(x-1)(x+1)", 1.0, "naive_fn"),
    (boxed("\\frac{x}{2}"), "0.5x", 1.0, "naive_fn"),
    (boxed("2x+1+x^2"), "x^2+2x+1", 1.0, "naive_fn"),
    (boxed("\\log_2 8"), "3", 1.0, "naive_fn"),
    (boxed("\\binom{5}{2}"), "10", 1.0, "naive_fn"),
    (boxed("\\sin(\\pi/6)"), "\\frac12", 1.0, "naive_fn"),
    (boxed("2^{10}"), "1024", 1.0, "naive_fn"),
    (boxed("0.3333333"), "\\frac{1}{3}", 1.0, "naive_fn"),
    (boxed("\\displaystyle\\frac{1}{2}"), "\\frac12", 1.0, "naive_fn"),
    (boxed("+\\infty"), "\\infty", 1.0, "naive_fn"),
    # --- tuples, intervals, sets -------------------------------------------------------------------
    (boxed("\\left(1,2\\right)"), "(1,2)", 1.0, "structure"),
    (boxed("(1, 2)"), "(1,2)", 1.0, "structure"),
    (boxed("(1,2]"), "(1, 2]", 1.0, "structure"),
    (boxed("\\left[1,2\\right)"), "[1,2)", 1.0, "structure"),
    (boxed("(-\\infty, 3)"), "(-\\infty,3)", 1.0, "structure"),
    (boxed("(-\\infty,3]"), "(-\\infty, 3]", 1.0, "structure"),
    (boxed("\\{3,1,2\\}"), "\\{1,2,3\\}", 1.0, "structure"),
    (boxed("\\{1, 2\\}"), "\\{2,1\\}", 1.0, "structure"),
    (boxed("\\left\\{1,2\\right\\}"), "\\{1,2\\}", 1.0, "structure"),
    (boxed("(0.5, \\frac{3}{4})"), "(\\frac12, 0.75)", 1.0, "structure"),
    (boxed("x \\in (1,2)"), "(1,2)", 1.0, "structure"),
    (boxed("(\\sqrt{2}, 1)"), "(\\sqrt{2},1)", 1.0, "structure"),
    (boxed("(2,1)"), "(1,2)", 0.0, "structure"),
    (boxed("[1,2]"), "(1,2)", 0.0, "structure"),
    (boxed("(1,2)"), "(1,2]", 0.0, "structure"),
    (boxed("\\{1,2\\}"), "\\{1,2,3\\}", 0.0, "structure"),
    (boxed("(1,2,3)"), "(1,2)", 0.0, "structure"),
    (boxed("\\{1,3\\}"), "\\{1,2\\}", 0.0, "structure"),
    (boxed("(-\\infty, 3)"), "(-\\infty, 3]", 0.0, "structure"),
    (boxed("(3, 1)"), "(1, 3)", 0.0, "structure"),
    # --- near misses ---------------------------------------------------------------------------
    (boxed("\\frac{4}{3}"), "\\frac34", 0.0, "wrong"),
    (boxed("0.7"), "\\frac{3}{4}", 0.0, "wrong"),
    (boxed("0.33"), "\\frac13", 0.0, "wrong"),
    (boxed("x^2+1"), "(x+1)^2", 0.0, "wrong"),
    (boxed("3\\sqrt{2}"), "2\\sqrt{3}", 0.0, "wrong"),
    (boxed("\\pi"), "\\frac{\\pi}{2}", 0.0, "wrong"),
    (boxed("1500.1"), "1.5\\times10^3", 0.0, "wrong"),
    (boxed("31^\\circ"), "30", 0.0, "wrong"),
    (boxed("-7"), "7", 0.0, "wrong"),
    (boxed("7"), "-7", 0.0, "wrong"),
    (boxed("1001"), "1,000", 0.0, "wrong"),
    (boxed("0"), "1", 0.0, "wrong"),
    (boxed("x=4"), "3", 0.0, "wrong"),
    (boxed("Bob"), "Evelyn", 0.0, "wrong"),
    (boxed("B"), "\\text{(C)}", 0.0, "wrong"),
    (boxed("\\sqrt{2}"), "2", 0.0, "wrong"),
    (boxed("2^{10}"), "1000", 0.0, "wrong"),
    (boxed("1.41"), "\\sqrt{2}", 0.0, "wrong"),
    (boxed("3.14"), "\\pi", 0.0, "wrong"),
    (boxed("2x+1"), "2x-1", 0.0, "wrong"),
    (boxed("\\frac{1}{2}"), "2", 0.0, "wrong"),
    (boxed("50\\%"), "0.05", 0.0, "wrong"),
    (boxed("1.5\\times10^{4}"), "1500", 0.0, "wrong"),
    (boxed("\\frac{\\sqrt{3}}{3}"), "\\sqrt{3}", 0.0, "wrong"),
    # --- adversarial: refused or bounded, never a crash ----------------------------------------
    (boxed("2^{10^{10}}"), "3", 0.0, "adversarial"),
    (boxed("10^{100000000}"), "1", 0.0, "adversarial"),
    (boxed("9999999!"), "1", 0.0, "adversarial"),
    (boxed("(10^{10})!"), "1", 0.0, "adversarial"),
    (boxed("{" * 500 + "1" + "}" * 500), "1", 0.0, "adversarial"),
    (boxed("1" * 5000), "1", 0.0, "adversarial"),
    (boxed("1e999999999"), "1", 0.0, "adversarial"),
    ("<think>" + "so 4 " * 20000 + "</think> \\boxed{4}", "4", 1.0, "adversarial"),
    ("<think>" + "{" * 50000 + "</think> \\boxed{4}", "4", 1.0, "adversarial"),
    (T + "\\boxed{" + "{" * 50000, "4", 0.0, "adversarial"),
    (T + "\\boxed" * 20000, "4", 0.0, "adversarial"),
]

# The `format` rows under the relaxed rule (other prompt templates): graded as a whole / marked answers.
RELAXED = {
    ("\\boxed{4}", "4"): 1.0,
    (T + "The answer is 4.", "4"): 1.0,
    (T + "Final answer: 4", "4"): 1.0,
    (T + "**Final Answer:** 4", "4"): 1.0,
    (T + "The answer is $\\frac{1}{2}$.", "\\frac12"): 1.0,
    (T + "So the final answer is 3.5. I hope it is correct.", "\\frac{7}{2}"): 1.0,
    ("The answer is \\boxed{4}.", "4"): 1.0,
    ("I think it is 4", "4"): 0.0,
}

# Generous: this table checks correctness; time bounds are tested in test_reward_time_bound.py.
TABLE_TIMEOUT_S = 10.0


def vendor_rule(response: str, ground_truth: str) -> float:
    """The vendor's reward as its description states: substring, or the boxed content equals it."""
    box = last_boxed(response)
    return 1.0 if ground_truth in response or (box is not None and box.text == ground_truth) else 0.0


def naive_rule(response: str, ground_truth: str) -> float:
    box = last_boxed(response)
    return 1.0 if box is not None and box.text == ground_truth else 0.0


def test_table_covers_every_rule_with_150_cases():
    tags = {tag for *_, tag in CASES}
    assert len(CASES) >= 150
    assert tags == {"rule", "format", "vendor_fp", "naive_fn", "structure", "wrong", "adversarial"}
    assert set(RELAXED) == {(r, t) for r, t, _, tag in CASES if tag == "format"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("response, truth, expected, tag", CASES, ids=[f"{i}-{c[3]}" for i, c in enumerate(CASES)])
def test_compute_score_table(pool, response, truth, expected, tag):
    result = grade(response, truth, timeout_s=TABLE_TIMEOUT_S, pool=pool)
    assert result.score == expected, result.reason


@pytest.mark.timeout(300)
@pytest.mark.parametrize("response, truth, expected, tag", CASES, ids=[f"{i}-{c[3]}" for i, c in enumerate(CASES)])
def test_relaxed_rule_changes_only_the_format_rows(pool, response, truth, expected, tag):
    relaxed = grade(response, truth, timeout_s=TABLE_TIMEOUT_S, pool=pool, format_rule="relaxed")
    assert relaxed.score == RELAXED.get((response, truth), expected), relaxed.reason


@pytest.mark.parametrize("response, truth", [(r, t) for r, t, _, tag in CASES if tag == "vendor_fp"])
def test_vendor_rule_really_scores_these_one(response, truth):
    assert vendor_rule(response, truth) == 1.0


@pytest.mark.parametrize("response, truth", [(r, t) for r, t, _, tag in CASES if tag == "naive_fn"])
def test_naive_comparison_really_rejects_these(response, truth):
    assert naive_rule(response, truth) == 0.0


@pytest.mark.timeout(300)
def test_batch_path_agrees_with_single_calls(pool):
    clear_caches()  # make the batch path judge every symbolic pair itself
    grades = grade_batch([c[0] for c in CASES], [c[1] for c in CASES], timeout_s=TABLE_TIMEOUT_S, pool=pool)
    wrong = [(i, CASES[i][0][-60:], CASES[i][1], g) for i, g in enumerate(grades) if g.score != CASES[i][2]]
    assert not wrong
    assert all(g.score in (0.0, 1.0) and isinstance(g.score, float) for g in grades)
