"""Which part of a response is graded."""

from __future__ import annotations

import pytest

from verl_patches.reward.extract import (
    AnswerSource,
    FormatRule,
    extract_final_answer,
    final_section,
    last_boxed,
    marked_answer,
    parse_format_rule,
)


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>a</think>b", "b"),
        ("<think>a</think>b</think>c", "c"),
        ("no tags", "no tags"),
        ("<think>open", None),
        ("<think>a</think>b<think>c", None),
        ("x</think>y", "y"),
    ],
)
def test_final_section(response, expected):
    assert final_section(response) == expected


@pytest.mark.parametrize(
    "text, answer, source",
    [
        ("\\boxed{1} \\boxed{2}", "2", AnswerSource.BOXED),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", AnswerSource.BOXED),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}", AnswerSource.BOXED),
        ("\\boxed{a\\}b}", "a\\}b", AnswerSource.BOXED),
        ("\\boxed {3}", "3", AnswerSource.BOXED),
        ("\\boxed 3.", "3", AnswerSource.BOXED),
        ("$\\boxed 3$", "3", AnswerSource.BOXED),
        ("\\fbox{3} then \\boxed{4}", "4", AnswerSource.BOXED),
        ("\\boxed{4} then \\fbox{3}", "3", AnswerSource.BOXED),
        ("\\boxed{3", None, AnswerSource.MALFORMED_BOX),
        ("\\boxed", None, AnswerSource.MALFORMED_BOX),
        ("\\boxed{3} \\boxedfoo", "3", AnswerSource.BOXED),
    ],
)
def test_last_boxed(text, answer, source):
    found = last_boxed(text)
    assert found is not None
    assert (found.text, found.source) == (answer, source)


def test_no_box_is_none():
    assert last_boxed("plain 3") is None


@pytest.mark.parametrize(
    "text, answer",
    [
        ("The answer is 5.", "5"),
        ("The answer is 3.5.", "3.5"),
        ("The final answer is $\\frac{1}{2}$. I hope it is correct.", "\\frac{1}{2}"),
        ("Final Answer: 12\nThanks", "12"),
        ("**Answer:** 7", "7"),
        ("The answer is 4. Actually the answer is 6.", "6"),
        ("answer is \\(x+1\\)", "x+1"),
        ("no marker 5", None),
        ("The answer is", None),
    ],
)
def test_marked_answer(text, answer):
    assert marked_answer(text) == answer


def test_box_beats_marker_and_both_only_after_think():
    relaxed = FormatRule.RELAXED
    assert extract_final_answer("<think>the answer is 1</think> the answer is 2", relaxed).text == "2"
    assert extract_final_answer("<think>\\boxed{1}</think> the answer is 2, \\boxed{3}", relaxed).text == "3"
    assert extract_final_answer("<think>\\boxed{1}</think> nothing", relaxed).source is AnswerSource.NONE
    assert extract_final_answer("<think>\\boxed{1}", relaxed).source is AnswerSource.UNCLOSED_THINK
    assert extract_final_answer("no tags, the answer is 2", relaxed).text == "2"
    assert extract_final_answer("no tags \\boxed{2}", relaxed).text == "2"


@pytest.mark.parametrize(
    "response, answer, source",
    [
        ("<think>a</think> \\boxed{2}", "2", AnswerSource.BOXED),
        ("a</think> \\fbox{2}", "2", AnswerSource.BOXED),
        ("<think>a</think> \\boxed 2", "2", AnswerSource.BOXED),
        ("<think>a</think> the answer is 2", None, AnswerSource.NONE),
        ("<think>\\boxed{2}</think> so 2", None, AnswerSource.NONE),
        ("\\boxed{2}", None, AnswerSource.NO_THINK_CLOSE),
        ("the answer is 2", None, AnswerSource.NO_THINK_CLOSE),
        ("<think>\\boxed{2}", None, AnswerSource.UNCLOSED_THINK),
        ("<think>a</think> \\boxed{2} <think>b", None, AnswerSource.UNCLOSED_THINK),
        ("<think>a</think> \\boxed{2", None, AnswerSource.MALFORMED_BOX),
    ],
)
def test_strict_rule_needs_think_close_and_a_box_after_it(response, answer, source):
    found = extract_final_answer(response)  # strict is the default
    assert (found.text, found.source) == (answer, source)
    assert extract_final_answer(response, FormatRule.STRICT) == found


@pytest.mark.parametrize("value", ["strict", "relaxed", FormatRule.STRICT])
def test_format_rule_values(value):
    assert parse_format_rule(value) in (FormatRule.STRICT, FormatRule.RELAXED)


@pytest.mark.parametrize("value", ["Strict", "r1_zero", "", None, 1])
def test_bad_format_rule_is_one_clear_error_naming_the_key(value):
    with pytest.raises(ValueError, match=r"custom_reward_function\.reward_kwargs\.format_rule=.*strict, relaxed"):
        parse_format_rule(value)


def test_extraction_is_linear_on_huge_inputs():
    import time

    nasty = "<think>" + "{" * 200_000 + "</think>" + "\\boxed{" * 50_000 + "the answer is " * 20_000
    started = time.monotonic()
    extract_final_answer(nasty)
    assert time.monotonic() - started < 1.0
