"""Plain numbers: their exact value, how precisely they were written, and when two are equal.

A plain number is an integer, a decimal, a fraction of those, scientific notation, a repeating
decimal (`0.\\overline{3}`, `0.1(6)`, `0.\\dot{3}`, `0.333...`) or a number written in words
(`twenty-one`, `two thirds`). All values are exact `Fraction`s.

Equality: exact numbers (integers, fractions, repeating decimals, `a \\times 10^k` with an integer
mantissa) compare exactly. A number written with a decimal point is inexact: it equals a value when it
is that value correctly rounded to the places written (within half a unit in its last place) and it
was written to at least `MIN_RELATIVE_PRECISION` of the value. So `0.333333` equals 1/3 but `0.33` does
not, `0.0000001` equals neither 0 nor `0.0000002`, and `1234568.0` is not 1234567.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

# Digits accepted in one numeric literal; Python refuses int() beyond 4300 digits anyway.
MAX_NUMBER_DIGITS = 400
# Largest power of ten accepted in scientific notation, so 1e999999999 never builds a huge integer.
MAX_DECIMAL_EXPONENT = 400
# An inexact number must be written to this relative precision to stand for a value it rounds from:
# the unit in its last place may be at most this fraction of the value (about six significant digits).
MIN_RELATIVE_PRECISION = Fraction(1, 10**5)


@dataclass(frozen=True)
class PlainNumber:
    value: Fraction
    inexact: bool  # written with a decimal point: stands for every value that rounds to it
    ulp: Fraction | None = None  # unit in the last written place (inexact numbers only)


_INTEGER = re.compile(r"[-+]?\d+")
_DECIMAL = re.compile(r"[-+]?(?:\d+\.(?P<a>\d*)|\.(?P<b>\d+))")
_SCIENTIFIC = re.compile(
    r"(?P<mantissa>[-+]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:[eE](?P<e>[-+]?\d{1,3})|(?:\\times|\\cdot|\*|×)10\^(?:\{(?P<braced>[-+]?\d{1,3})\}|(?P<bare>\d)))"
)
_LATEX_FRACTION = re.compile(r"(?P<sign>[-+]?)\\frac\{(?P<num>[^{}]+)\}\{(?P<den>[^{}]+)\}")
_SLASH_FRACTION = re.compile(r"(?P<num>[-+]?[\d.]+)/(?P<den>[-+]?[\d.]+)")
# Repeating decimals: integer part, fixed decimals, then the repetend in one of the usual notations.
_REPEATING = re.compile(
    r"(?P<sign>[-+]?)(?P<int>\d*)\.(?P<fixed>\d*)"
    r"(?:\\overline\{(?P<over>\d+)\}|\\bar\{(?P<bar>\d+)\}|\((?P<paren>\d+)\)"
    r"|\\dot\{(?P<first>\d)\}(?P<mid>\d*)\\dot\{(?P<last>\d)\}|\\dot\{(?P<dot>\d)\})"
)
_ELLIPSIS = re.compile(r"(?P<sign>[-+]?)(?P<int>\d*)\.(?P<digits>\d+)(?:\\ldots|\\dots|\\cdots|\.\.\.|…)")


def _simple_number(text: str) -> PlainNumber | None:
    if len(text) > MAX_NUMBER_DIGITS:
        return None
    if _INTEGER.fullmatch(text):
        return PlainNumber(Fraction(int(text)), inexact=False)
    decimal = _DECIMAL.fullmatch(text)
    if decimal:
        places = len(decimal.group("a") if decimal.group("a") is not None else decimal.group("b"))
        return PlainNumber(Fraction(text), inexact=True, ulp=Fraction(1, 10**places))
    return None


def _repeating_value(sign: str, whole: str, fixed: str, repetend: str) -> PlainNumber:
    value = Fraction(int(whole or "0")) + Fraction(int(fixed or "0"), 10 ** len(fixed))
    value += Fraction(int(repetend), (10 ** len(repetend) - 1) * 10 ** len(fixed))
    return PlainNumber(-value if sign == "-" else value, inexact=False)


def _repeating(text: str) -> PlainNumber | None:
    match = _REPEATING.fullmatch(text)
    if match:
        g = match.groupdict()
        if g["first"] is not None:
            repetend = g["first"] + g["mid"] + g["last"]
        else:
            repetend = g["over"] or g["bar"] or g["paren"] or g["dot"]
        return _repeating_value(g["sign"], g["int"], g["fixed"], repetend)
    match = _ELLIPSIS.fullmatch(text)
    if match:
        # `0.333...` / `0.142857142857...`: only a block visibly repeated (one digit three times, a
        # longer block twice) is a repetend; `0.5...` says nothing about what follows.
        digits = match.group("digits")
        for size in range(1, min(6, len(digits) // 2) + 1):
            block = digits[-size:]
            times = 3 if size == 1 else 2
            if len(digits) >= size * times and digits.endswith(block * times):
                fixed = digits[: len(digits) - size * times]
                # The shortest prefix that still repeats: 0.1666... is 0.1 then 6 repeating.
                while fixed and fixed[-1] == block[-1]:
                    fixed, block = fixed[:-1], block[-1] + block[:-1]
                return _repeating_value(match.group("sign"), match.group("int"), fixed, block)
    return None


def parse_plain_number(text: str) -> PlainNumber | None:
    """The exact value of an integer, decimal, fraction, scientific-notation or repeating-decimal literal."""
    simple = _simple_number(text)
    if simple is not None:
        return simple
    if len(text) > MAX_NUMBER_DIGITS:
        return None
    sci = _SCIENTIFIC.fullmatch(text)
    if sci:
        exponent = int(sci.group("e") or sci.group("braced") or sci.group("bare"))
        if abs(exponent) > MAX_DECIMAL_EXPONENT:
            return None
        mantissa = _simple_number(sci.group("mantissa"))
        if mantissa is None:
            return None
        scale = Fraction(10) ** exponent
        ulp = mantissa.ulp * scale if mantissa.ulp is not None else None
        return PlainNumber(mantissa.value * scale, inexact=mantissa.inexact, ulp=ulp)
    frac = _LATEX_FRACTION.fullmatch(text) or _SLASH_FRACTION.fullmatch(text)
    if frac:
        num = _simple_number(frac.group("num"))
        den = _simple_number(frac.group("den"))
        if num is None or den is None or den.value == 0:
            return None
        value = num.value / den.value
        if frac.groupdict().get("sign") == "-":
            value = -value
        # A quotient of decimals has no single written precision: its value is taken as exact.
        return PlainNumber(value, inexact=False)
    return _repeating(text)


def tolerance(number: PlainNumber) -> Fraction | None:
    """How far a value may be from `number` and still be what it stands for; None: exactly equal only."""
    if not number.inexact or number.ulp is None:
        return None
    return number.ulp / 2


def _stands_for(number: PlainNumber, value: Fraction, scale: Fraction) -> bool:
    """Whether `number` (divided by `scale`) is `value` rounded to the places it was written with."""
    if number.value / scale == value:
        return True
    allowed = tolerance(number)
    if allowed is None:
        return False
    allowed /= scale
    return abs(number.value / scale - value) <= allowed and 2 * allowed <= MIN_RELATIVE_PRECISION * abs(value)


def stands_for(number: PlainNumber, value: Fraction) -> bool:
    """Whether `number` is `value` (exactly, or rounded to its written places for an inexact number)."""
    return _stands_for(number, value, Fraction(1))


def numbers_equal(a: PlainNumber, b: PlainNumber, a_percent: bool = False, b_percent: bool = False) -> bool:
    """Equal values; a percent on one side only may be read as v or v/100 ("25%" answers 25 and 0.25)."""
    if a_percent == b_percent:
        scales = [(Fraction(1), Fraction(1))]
    elif a_percent:
        scales = [(Fraction(1), Fraction(1)), (Fraction(100), Fraction(1))]
    else:
        scales = [(Fraction(1), Fraction(1)), (Fraction(1), Fraction(100))]
    for scale_a, scale_b in scales:
        if _stands_for(a, b.value / scale_b, scale_a) or _stands_for(b, a.value / scale_a, scale_b):
            return True
    return False


# --- numbers written as words -----------------------------------------------------------------------

_UNITS = {
    "zero": 0,
    "one": 1,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12}
_DENOMINATORS = {
    "half": 2,
    "halves": 2,
    "third": 3,
    "thirds": 3,
    "quarter": 4,
    "quarters": 4,
    "fourth": 4,
    "fourths": 4,
    "fifth": 5,
    "fifths": 5,
    "sixth": 6,
    "sixths": 6,
    "seventh": 7,
    "sevenths": 7,
    "eighth": 8,
    "eighths": 8,
    "ninth": 9,
    "ninths": 9,
    "tenth": 10,
    "tenths": 10,
}
_WORD_SPLIT = re.compile(r"[\s\-]+")
_WORD_LIKE = re.compile(r"[A-Za-z][A-Za-z\s\-]*\.?")
_MAX_WORDS = 12


def _cardinal(words: list[str]) -> int | None:
    """`twenty one` -> 21, `one hundred and five` -> 105; None unless every word is part of the number."""
    if not words or words == ["a"]:  # a lone "a" is a variable, not one
        return None
    total = current = 0
    seen_digit_word = False
    for word in words:
        if word in _UNITS:
            current += _UNITS[word]
            seen_digit_word = True
        elif word == "hundred" and seen_digit_word:
            current *= 100
        elif word in _SCALES and word != "hundred" and seen_digit_word:
            total += current * _SCALES[word]
            current = 0
        elif word == "and" and seen_digit_word:
            continue
        elif word == "a" and not seen_digit_word:
            current, seen_digit_word = 1, True
        else:
            return None
    return total + current


def number_from_words(text: str) -> Fraction | None:
    """The value of a number written in words (`five`, `negative twenty-one`, `two thirds`), else None."""
    if not _WORD_LIKE.fullmatch(text):
        return None
    words = [w for w in _WORD_SPLIT.split(text.strip().lower().rstrip(".")) if w]
    if not words or len(words) > _MAX_WORDS or not all(w.isalpha() for w in words):
        return None
    sign = 1
    if words[0] in ("negative", "minus"):
        sign, words = -1, words[1:]
    if words and words[-1] in _DENOMINATORS:
        numerator = 1 if words[:-1] == ["a"] else _cardinal(words[:-1])
        if numerator is None:
            return None
        return sign * Fraction(numerator, _DENOMINATORS[words[-1]])
    value = _cardinal(words)
    return None if value is None else sign * Fraction(value)
