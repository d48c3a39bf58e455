"""Property tests: what the model writes before its reasoning, or inside it, cannot earn reward."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_patches.reward.deepscaler import grade, prejudge

_FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "\\boxed{", "}", "{", "the answer is ", "\\fbox", "$", "7", "\n", " "]
)
# Free text that also mixes in the tags and markers the grader looks for.
noisy_text = st.lists(st.one_of(st.text(max_size=20), _FRAGMENTS), max_size=12).map("".join)
integers = st.integers(min_value=-10_000, max_value=10_000)

_settings = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def renderings(value: Fraction) -> list[str]:
    """Several ways to write value; all must score 1 against any other."""
    p, q = value.numerator, value.denominator
    forms = [f"\\frac{{{p}}}{{{q}}}", f"{p}/{q}", f"\\dfrac{{{p}}}{{{q}}}", f"\\frac{{{2 * p}}}{{{2 * q}}}"]
    if q == 1:
        forms += [str(p), f"{p}.0", f"{p:,}".replace(",", "{,}")]
    if 10**6 % q == 0:
        forms.append(str(float(value)) if abs(p) < 10**6 else f"{float(value):.6f}")
    return forms


@_settings
@given(prefix=noisy_text, reasoning=noisy_text.filter(lambda s: "think>" not in s), answer=integers, truth=integers)
def test_text_before_think_never_changes_the_score(pool, prefix, reasoning, answer, truth):
    response = f"<think>{reasoning}</think> The answer is \\boxed{{{answer}}}."
    assert grade(prefix + response, str(truth), pool=pool).score == grade(response, str(truth), pool=pool).score


@_settings
@given(reasoning=noisy_text.filter(lambda s: "think>" not in s), truth=integers, delta=st.integers(1, 50))
def test_correct_box_inside_think_with_wrong_final_answer_scores_zero(pool, reasoning, truth, delta):
    response = f"<think>{reasoning} so \\boxed{{{truth}}}</think> The answer is \\boxed{{{truth + delta}}}."
    assert grade(response, str(truth), pool=pool).score == 0.0


@_settings
@given(reasoning=noisy_text.filter(lambda s: "think>" not in s), truth=integers)
def test_unclosed_think_scores_zero_even_with_the_right_box(pool, reasoning, truth):
    assert grade(f"<think>{reasoning} \\boxed{{{truth}}}", str(truth), pool=pool).score == 0.0


@_settings
@given(
    value=st.fractions(min_value=-1000, max_value=1000, max_denominator=64),
    data=st.data(),
)
def test_every_rendering_of_a_number_is_equal_and_other_numbers_are_not(pool, value, data):
    forms = renderings(value)
    pred = data.draw(st.sampled_from(forms))
    truth = data.draw(st.sampled_from(forms))
    assert grade(f"<think>x</think> \\boxed{{{pred}}}", truth, pool=pool).score == 1.0
    other = value + Fraction(1, data.draw(st.integers(1, 7)))
    assert grade(f"<think>x</think> \\boxed{{{pred}}}", renderings(other)[0], pool=pool).score == 0.0


@settings(max_examples=300, deadline=None, database=None)
@given(response=noisy_text, truth=st.one_of(noisy_text, integers.map(str)))
def test_prejudge_never_raises(response, truth):
    result = prejudge(response, truth)
    assert isinstance(result, tuple) or result.score in (0.0, 1.0)
