"""Canonical answer strings and the fast comparison that settles most answers without sympy.

The canonical form removes notation that never changes the value (`\\left`, `\\!`, `\\dfrac`,
`^\\circ`, `\\%`, units such as `\\text{ m/s}`, `x =` prefixes, thousands separators, spacing), turns
unicode mathematics into LaTeX and numbers written in words into digits, and writes a solution list
(`x=1 or x=2`) as a comma list of its values. Comparison then tries, in order: equal canonical
strings; exact values of plain numbers (see `numbers`); tuples, intervals, sets and solution lists
of plain numbers. When both sides are plain numbers (or same-kind brackets of them) the answer is
decided here, right or wrong; anything else is left to the symbolic path, except two shapes that
are never right: a bare value for an equation (`5` for `x+y=5`) and several alternatives for a
single-valued ground truth (`1 or 2` for `2`). All steps are linear-time scans and small loops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from verl_patches.reward.numbers import (  # noqa: F401  (re-exported: the plain-number API lives here too)
    PlainNumber,
    number_from_words,
    numbers_equal,
    parse_plain_number,
)
from verl_patches.reward.solutions import is_equation, solution_values, split_assignment
from verl_patches.reward.unicode_math import unicode_to_latex
from verl_patches.reward.units import strip_units


@dataclass(frozen=True)
class CanonicalAnswer:
    text: str
    percent: bool = False  # a `%` was stripped: the value may be read as v or v/100


_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr|big|Big|bigg|Bigg)(?![A-Za-z])\.?")
_NEGATIVE_SPACE = re.compile(r"\\!")
_SPACING = re.compile(r"\\[,;: ]|\\q?quad(?![A-Za-z])|~")
_DISPLAY = re.compile(r"\\(?:displaystyle|textstyle|scriptstyle|limits|nolimits)(?![A-Za-z])")
_FRAC_VARIANT = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_BINOM_VARIANT = re.compile(r"\\[dt]binom(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°")
_CURRENCY = re.compile(r"\\\$")
_PERCENT = re.compile(r"\\%|%|\\percent(?![A-Za-z])|\\text\{\s*percent\s*\}|(?<![A-Za-z])percent$")
_CONNECTOR_TEXT = re.compile(r"\\(?:text|mbox|textrm|mathrm)\s*\{\s*(or|and)\s*\}")
_TEXT_WRAPPER = re.compile(r"\\(?:text|mbox|mathrm|textrm|textnormal|textbf|mathbf|textit|mathit)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRAC_SHORT_BOTH = re.compile(r"\\frac(\d)(\d)")
_FRAC_SHORT_DEN = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_FRAC_SHORT_NUM = re.compile(r"\\frac(\d)\{")
_SQRT_SHORT = re.compile(r"\\sqrt(\d)")
_MULTIPLE_CHOICE = re.compile(r"^\(([A-Ea-e])\)$")
_CONTROL_WORD_END = re.compile(r"\\[A-Za-z]+$")
# Ground truths with several values in one expression: a list of alternatives may match them.
_MULTI_VALUED = re.compile(r"\\(?:pm|mp|begin|cup)(?![A-Za-z])")


def _strip_delimiters(text: str) -> str:
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if text.startswith(left) and text.endswith(right) and len(text) >= len(left) + len(right):
                text = text[len(left) : len(text) - len(right)].strip()
                changed = True
    return text


def _remove_whitespace(text: str) -> str:
    """Drop whitespace, except one space that separates a control word from a following letter."""
    pieces: list[str] = []
    i, n = 0, len(text)
    while i < n:
        if text[i].isspace():
            j = i
            while j < n and text[j].isspace():
                j += 1
            if j < n and text[j].isalpha() and _CONTROL_WORD_END.search(text[max(0, i - 40) : i]):
                pieces.append(" ")
            i = j
            continue
        pieces.append(text[i])
        i += 1
    return "".join(pieces)


def balanced(text: str) -> bool:
    """Whether every `{` has its `}` (escaped `\\{ \\}` aside); canonical forms must keep this."""
    depth = 0
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return False
        i += 1
    return depth == 0


def _drop_full_stop(text: str) -> str:
    """Strip spaces and one sentence-ending period; an ellipsis (`0.333...`) is part of the value."""
    text = text.strip()
    if text.endswith(".") and not text.endswith("..."):
        text = text[:-1].rstrip()
    return text


def _canonical_item(text: str, keep_assignment: bool) -> str:
    """Canonical form of one value (an answer, or one item of a solution list)."""
    text = strip_units(text)
    text = _TEXT_WRAPPER.sub(lambda m: m.group(1), text)
    text = _drop_full_stop(strip_units(text))
    variable, value = split_assignment(text)
    if variable is not None and not keep_assignment:
        text = strip_units(value)
    words = number_from_words(text)
    if words is not None:
        text = str(words.numerator) if words.denominator == 1 else f"\\frac{{{words.numerator}}}{{{words.denominator}}}"
    text = _remove_whitespace(text)
    text = _FRAC_SHORT_BOTH.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_SHORT_DEN.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_SHORT_NUM.sub(r"\\frac{\1}{", text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)
    choice = _MULTIPLE_CHOICE.match(text)
    if choice:
        text = choice.group(1)
    if text.startswith("+"):
        text = text[1:]
    return text


def canonical_answer(answer: str, keep_assignment: bool = False) -> CanonicalAnswer:
    """A canonical string for an answer; equal strings mean equal answers.

    `x = 3` becomes `3`, unless keep_assignment: an answer compared with an equation (`2x+1=y`) keeps
    its `y =`, so that it is compared as an equation and never as one side of it.
    """
    text = unicode_to_latex(_strip_delimiters(answer))
    text = _DISPLAY.sub("", text)
    text = _SIZING.sub("", text)
    text = _NEGATIVE_SPACE.sub("", text)
    text = _SPACING.sub(" ", text)
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _BINOM_VARIANT.sub(r"\\binom", text)
    text = _DEGREES.sub("", text)
    text = _CURRENCY.sub("", text)
    text = _drop_full_stop(text.replace("{,}", ","))
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text).strip()
    text = _CONNECTOR_TEXT.sub(lambda m: f" {m.group(1)} ", text)
    compact = _remove_whitespace(text)
    if _THOUSANDS.fullmatch(compact) and ", " not in text:
        text = compact.replace(",", "")
    # Before splitting at "and": `one hundred and five` is one number.
    values = None if number_from_words(text) is not None else solution_values(text)
    if values is None:
        return CanonicalAnswer(text=_canonical_item(text, keep_assignment), percent=percent)
    return CanonicalAnswer(text=",".join(_canonical_item(value, keep_assignment) for value in values), percent=percent)


@dataclass(frozen=True)
class Bracketed:
    opening: str  # "(", "[", "{" or "" for a bare comma list
    closing: str
    items: tuple[str, ...]


def _split_top_level(body: str) -> list[str] | None:
    items, depth, start, i = [], 0, 0, 0
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body) and body[i + 1] in "{}":
            depth += 1 if body[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            items.append(body[start:i])
            start = i + 1
        i += 1
    if depth != 0:
        return None
    items.append(body[start:])
    return items


def _group_end(text: str) -> int | None:
    """Index where the bracket opened at text[0] is closed (any closer counts: intervals mix them)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i
    return None


def split_bracketed(text: str) -> Bracketed | None:
    """A tuple, interval, set or bare comma list split into its top-level items."""
    if text.startswith("\\{") and text.endswith("\\}"):
        opening, closing, body = "{", "}", text[2:-2]
    elif text[:1] in "([" and text[-1:] in ")]" and len(text) >= 2:
        opening, closing, body = text[0], text[-1], text[1:-1]
    else:
        opening, closing, body = "", "", text
    items = _split_top_level(body)
    if items is None or (opening == "" and len(items) < 2):
        return None
    if opening in ("(", "[") and _group_end(text) != len(text) - 1:
        return None  # e.g. "(1)+(2)": the outer brackets are not one group
    return Bracketed(opening, closing, tuple(item for item in items))


def _numbers(items: tuple[str, ...]) -> list[PlainNumber] | None:
    parsed = [parse_plain_number(item) for item in items]
    return None if any(p is None for p in parsed) else parsed  # type: ignore[return-value]


def _same_multiset(a: list[PlainNumber], b: list[PlainNumber]) -> bool:
    remaining = list(b)
    for x in a:
        match = next((k for k, y in enumerate(remaining) if numbers_equal(x, y)), None)
        if match is None:
            return False
        remaining.pop(match)
    return not remaining


def _unordered(opening: str) -> bool:
    # A set and a bare list (alternatives, or the solutions of an equation) have no order.
    return opening in ("{", "")


def fast_verdict(pred: CanonicalAnswer, truth: CanonicalAnswer) -> bool | None:
    """True/False when plain strings or numbers decide it; None when only symbolic math can."""
    if pred.text == truth.text:
        return bool(pred.text)
    if not pred.text or not truth.text or not balanced(pred.text) or not balanced(truth.text):
        return False
    if is_equation(truth.text) and not is_equation(pred.text):
        return False  # one side of an equation is not the equation (`5` for `x+y=5`)
    a, b = parse_plain_number(pred.text), parse_plain_number(truth.text)
    if a is not None and b is not None:
        return numbers_equal(a, b, pred.percent, truth.percent)
    sa, sb = split_bracketed(pred.text), split_bracketed(truth.text)
    if sa is not None and sa.opening == "" and sb is None and not _MULTI_VALUED.search(truth.text):
        return False  # several alternatives for one value: hedging is never right
    if sa is None or sb is None:
        return None
    na, nb = _numbers(sa.items), _numbers(sb.items)
    if na is None or nb is None:
        return None
    unordered = _unordered(sa.opening) and _unordered(sb.opening)
    if not unordered and (sa.opening, sa.closing) != (sb.opening, sb.closing):
        return None
    if len(na) != len(nb):
        return False
    if unordered:
        return _same_multiset(na, nb)
    return all(numbers_equal(x, y) for x, y in zip(na, nb))
