"""Canonical answer strings and the fast comparison that settles most answers without sympy.

The canonical form removes notation that never changes the value (`\\left`, `\\!`, `\\dfrac`,
`^\\circ`, `\\%`, `\\text{cm}` units, `x =` prefixes, thousands separators, spacing). Comparison then
tries, in order: equal canonical strings; exact rational values of plain numbers (integers, decimals,
fractions, scientific notation); tuples, intervals and sets of plain numbers. When both sides are
plain numbers (or same-kind brackets of plain numbers) the answer is decided here, right or wrong;
anything else is left to the symbolic path. All steps are linear-time regexes and small loops.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

# Digits accepted in one numeric literal; Python refuses int() beyond 4300 digits anyway.
_MAX_NUMBER_DIGITS = 400
# Largest power of ten accepted in scientific notation, so 1e999999999 never builds a huge integer.
_MAX_DECIMAL_EXPONENT = 400
# A decimal answer equals an exact value when both round to the same 6 decimals (as math-verify does).
DECIMAL_ROUNDING_PLACES = 6


@dataclass(frozen=True)
class CanonicalAnswer:
    text: str
    percent: bool = False  # a `%` was stripped: the value may be read as v or v/100


@dataclass(frozen=True)
class PlainNumber:
    value: Fraction
    inexact: bool  # written with a decimal point: compared after rounding


_SIZING = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|biggl|biggr|Biggl|Biggr|big|Big|bigg|Bigg)(?![A-Za-z])\.?")
_SPACING = re.compile(r"\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_DISPLAY = re.compile(r"\\(?:displaystyle|textstyle|scriptstyle)(?![A-Za-z])")
_FRAC_VARIANT = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_BINOM_VARIANT = re.compile(r"\\[dt]binom(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°")
_CURRENCY = re.compile(r"\\\$")
_PERCENT = re.compile(r"\\%|%|\\percent(?![A-Za-z])")
_TRAILING_TEXT_UNIT = re.compile(
    r"\\(?:text|mbox|mathrm|textrm|textnormal)\s*\{\s*[A-Za-z][A-Za-z .]*\}(?:\^\s*\{?\s*[23]\s*\}?)?\s*$"
)
_TEXT_WRAPPER = re.compile(r"\\(?:text|mbox|mathrm|textrm|textnormal|textbf|mathbf|textit|mathit)\s*\{([^{}]*)\}")
_MATH_WORDS = {"pi", "sqrt", "ln", "log", "sin", "cos", "tan", "and", "or", "to", "i", "e", "inf", "infinity"}
_TRAILING_WORD_UNIT = re.compile(r"^(?P<head>[-+]?[\d.,/]*\d)\s+(?P<unit>[A-Za-z]{2,}\.?(?:\s+[A-Za-z]{2,}\.?){0,3})(?:\^\s*\{?\s*[23]\s*\}?)?$")
_SIMPLE_LHS = re.compile(r"^\s*(?:[A-Za-z]|\\[A-Za-z]+)(?:_\{?[A-Za-z0-9]+\}?)?(?:\([A-Za-z]\))?\s*$")
_THOUSANDS = re.compile(r"^[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_FRAC_SHORT_BOTH = re.compile(r"\\frac(\d)(\d)")
_FRAC_SHORT_DEN = re.compile(r"\\frac\{([^{}]*)\}(\d)")
_FRAC_SHORT_NUM = re.compile(r"\\frac(\d)\{")
_SQRT_SHORT = re.compile(r"\\sqrt(\d)")
_MULTIPLE_CHOICE = re.compile(r"^\(([A-Ea-e])\)$")
_CONTROL_WORD_END = re.compile(r"\\[A-Za-z]+$")

_INTEGER = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+)")
_SCIENTIFIC = re.compile(
    r"(?P<mantissa>[-+]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:[eE](?P<e>[-+]?\d{1,3})|(?:\\times|\\cdot|\*|×)10\^(?:\{(?P<braced>[-+]?\d{1,3})\}|(?P<bare>\d)))"
)
_LATEX_FRACTION = re.compile(r"(?P<sign>[-+]?)\\frac\{(?P<num>[^{}]+)\}\{(?P<den>[^{}]+)\}")
_SLASH_FRACTION = re.compile(r"(?P<num>[-+]?[\d.]+)/(?P<den>[-+]?[\d.]+)")


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


def _strip_simple_assignment(text: str) -> str:
    """`x = 3` -> `3`; systems (`x=1, y=2`) and relations are kept for the symbolic path."""
    if text.count("=") != 1 or "," in text or "<" in text or ">" in text or "\\le" in text or "\\ge" in text:
        return text
    lhs, rhs = text.split("=")
    if rhs.strip() and _SIMPLE_LHS.match(lhs):
        return rhs.strip()
    return text


def _strip_units(text: str) -> str:
    unit = _TRAILING_TEXT_UNIT.search(text)
    if unit and any(ch.isdigit() for ch in text[: unit.start()]):
        text = text[: unit.start()].strip()
    text = _TEXT_WRAPPER.sub(lambda m: m.group(1), text)
    match = _TRAILING_WORD_UNIT.match(text.strip())
    if match and not any(word.rstrip(".").lower() in _MATH_WORDS for word in match.group("unit").split()):
        text = match.group("head")
    return text


def canonical_answer(answer: str) -> CanonicalAnswer:
    """A canonical string for an answer; equal strings mean equal answers."""
    text = _strip_delimiters(answer).replace("\u2212", "-")
    text = _DISPLAY.sub("", text)
    text = _SIZING.sub("", text)
    text = _SPACING.sub(" ", text)
    text = _FRAC_VARIANT.sub(r"\\frac", text)
    text = _BINOM_VARIANT.sub(r"\\binom", text)
    text = _DEGREES.sub("", text)
    text = _CURRENCY.sub("", text)
    percent = bool(_PERCENT.search(text))
    text = _PERCENT.sub("", text)
    text = _strip_units(text)
    text = text.replace("{,}", ",")
    text = text.strip().rstrip(".").strip()
    text = _strip_simple_assignment(text)
    text = _remove_whitespace(text)
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    text = _FRAC_SHORT_BOTH.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_SHORT_DEN.sub(r"\\frac{\1}{\2}", text)
    text = _FRAC_SHORT_NUM.sub(r"\\frac{\1}{", text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)
    choice = _MULTIPLE_CHOICE.match(text)
    if choice:
        text = choice.group(1)
    if text.startswith("+"):
        text = text[1:]
    return CanonicalAnswer(text=text, percent=percent)


def _simple_number(text: str) -> PlainNumber | None:
    if len(text) > _MAX_NUMBER_DIGITS:
        return None
    if _INTEGER.fullmatch(text):
        return PlainNumber(Fraction(int(text)), inexact=False)
    if _DECIMAL.fullmatch(text):
        return PlainNumber(Fraction(text), inexact=True)
    return None


def parse_plain_number(text: str) -> PlainNumber | None:
    """The exact value of an integer, decimal, fraction or scientific-notation literal, else None."""
    simple = _simple_number(text)
    if simple is not None:
        return simple
    if len(text) > _MAX_NUMBER_DIGITS:
        return None
    sci = _SCIENTIFIC.fullmatch(text)
    if sci:
        exponent = int(sci.group("e") or sci.group("braced") or sci.group("bare"))
        if abs(exponent) > _MAX_DECIMAL_EXPONENT:
            return None
        mantissa = _simple_number(sci.group("mantissa"))
        if mantissa is None:
            return None
        return PlainNumber(mantissa.value * Fraction(10) ** exponent, inexact=mantissa.inexact)
    frac = _LATEX_FRACTION.fullmatch(text) or _SLASH_FRACTION.fullmatch(text)
    if frac:
        num = _simple_number(frac.group("num"))
        den = _simple_number(frac.group("den"))
        if num is None or den is None or den.value == 0:
            return None
        value = num.value / den.value
        if frac.groupdict().get("sign") == "-":
            value = -value
        return PlainNumber(value, inexact=num.inexact or den.inexact)
    return None


def _values(number: PlainNumber, percent: bool) -> tuple[Fraction, ...]:
    # "25%" answers a question whose ground truth is written either as 25 or as 0.25.
    return (number.value, number.value / 100) if percent else (number.value,)


def numbers_equal(a: PlainNumber, b: PlainNumber, a_percent: bool = False, b_percent: bool = False) -> bool:
    inexact = a.inexact or b.inexact
    for x in _values(a, a_percent):
        for y in _values(b, b_percent):
            if x == y:
                return True
            if inexact and round(x, DECIMAL_ROUNDING_PLACES) == round(y, DECIMAL_ROUNDING_PLACES):
                return True
    return False


@dataclass(frozen=True)
class Bracketed:
    opening: str  # "(", "[", "{" or "" for a bare comma list
    closing: str
    items: tuple[str, ...]


_OPENERS = {"(": ")", "[": "]", "{": "}"}


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


def fast_verdict(pred: CanonicalAnswer, truth: CanonicalAnswer) -> bool | None:
    """True/False when plain strings or numbers decide it; None when only symbolic math can."""
    if pred.text == truth.text:
        return bool(pred.text)
    if not pred.text or not truth.text:
        return False
    a, b = parse_plain_number(pred.text), parse_plain_number(truth.text)
    if a is not None and b is not None:
        return numbers_equal(a, b, pred.percent, truth.percent)
    sa, sb = split_bracketed(pred.text), split_bracketed(truth.text)
    if sa is None or sb is None:
        return None
    na, nb = _numbers(sa.items), _numbers(sb.items)
    if na is None or nb is None or (sa.opening, sa.closing) != (sb.opening, sb.closing):
        return None
    if len(na) != len(nb):
        return False
    if sa.opening == "{":
        return _same_multiset(na, nb)
    if all(numbers_equal(x, y) for x, y in zip(na, nb)):
        return True
    if sa.opening == "" and _same_multiset(na, nb):
        return None  # a bare list may be an unordered list of solutions
    return False
