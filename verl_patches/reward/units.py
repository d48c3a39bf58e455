"""Units after a value: `5 \\text{ m/s}`, `3\\,\\mathrm{cm}^2`, `60 km/h`, `12 inches` are 5, 3, 60, 12.

Applied to the answer and the ground truth alike, so a unit on either side never decides the grade.
The unit tail is peeled right to left, one atom at a time: a text group (`\\text{...}`, `\\mathrm{...}`,
...), a unit word, an exponent (`^2`, `^{-1}`), or a separator (`/`, `\\cdot`, spacing). A bare word
(no text group) counts as a unit only when it is a known unit symbol or an ordinary word of four or
more letters: `3 xy^2` keeps its variables. What is left must still contain a digit, so a unit is
never the whole answer.
"""

from __future__ import annotations

import re

_TEXT_COMMANDS = ("text", "mbox", "mathrm", "textrm", "textnormal", "rm")
# Unit symbols of one to three letters (longer unit words are accepted as words).
UNIT_SYMBOLS = frozenset(
    """m cm mm km nm um dm s ms us ns h hr hrs min mins sec secs g kg mg lb lbs oz t ft yd mi in mph kph kmh
    L l mL ml cl dl N kN J kJ W kW MW V mV A mA Pa kPa MPa Hz kHz MHz GHz K mol cal deg rad sq cu ha ac
    yr yrs wk wks day pt qt gal cc""".split()
)
# Words of four letters or more that are mathematics, not units.
_NOT_UNITS = frozenset(
    """infinity infty undefined none true false even odd prime real reals integer integers rational
    irrational complex sqrt frac cdot times over plus minus divided equals than more less and""".split()
)
# Single-letter unit symbols are only read as units inside a compound (`m/s`) or a text group.
_SINGLE_LETTER_UNITS = frozenset("m s g h t l L N J W V A K".split())

_SEPARATOR_COMMANDS = ("\\,", "\\;", "\\:", "\\!", "\\ ", "\\cdot")
_TRAILING_EXPONENT = re.compile(r"\^\s*(?:\{\s*-?\s*\d\s*\}|-?\d)$")
_TEXT_GROUP = re.compile(r"\\(?:text|mbox|mathrm|textrm|textnormal|rm)\s*\{([^{}]*)\}")
_TEXT_CONTENT_NOISE = re.compile(r"\\[,;:! ]|\^\s*\{?\s*-?\s*\d\s*\}?|\\cdot|[\s/.~*]")


def _unit_word(word: str, compound: bool) -> bool:
    word = word.rstrip(".")
    if word in UNIT_SYMBOLS:
        return len(word) > 1 or compound
    return len(word) >= 4 and word.lower() not in _NOT_UNITS


def _bare_unit(token: str) -> bool:
    parts = token.rstrip(".").split("/")
    return all(_unit_word(part, compound=len(parts) > 1) for part in parts)


def _group_open(text: str, end: int) -> int | None:
    """Index of the `{` matching the `}` at text[end - 1]."""
    depth = 0
    for i in range(end - 1, -1, -1):
        if text[i] == "}":
            depth += 1
        elif text[i] == "{":
            depth -= 1
            if depth == 0:
                return i
    return None


def _text_group_start(text: str, end: int) -> int | None:
    """Start of a `\\text{...}`-like group ending at text[end - 1] == '}', if it is one."""
    opening = _group_open(text, end)
    if opening is None:
        return None
    head = text[:opening].rstrip()
    for command in _TEXT_COMMANDS:
        if head.endswith("\\" + command):
            return len(head) - len(command) - 1
    return None


def _unit_content(content: str) -> bool:
    """Whether a fraction's numerator or denominator is made of units (`\\text{m}`, `km`, `m^2`)."""
    content = _TEXT_GROUP.sub(lambda m: f" {m.group(1)} ", content)
    words = [w for w in re.split(r"[\s/.~*]+|\\[,;:! ]|\\cdot|\^\s*\{?\s*-?\s*\d\s*\}?", content) if w]
    return bool(words) and all(w.isalpha() and _unit_word(w, compound=True) for w in words)


def _unit_fraction_start(text: str, end: int) -> int | None:
    """Start of a `\\frac{\\text{m}}{\\text{s}}` unit ending at text[end - 1] == '}', if it is one."""
    denominator = _group_open(text, end)
    if denominator is None or denominator == 0 or text[denominator - 1] != "}":
        return None
    numerator = _group_open(text, denominator)
    if numerator is None:
        return None
    head = text[:numerator].rstrip()
    if not head.endswith("\\frac"):
        return None
    if not (_unit_content(text[numerator + 1 : denominator - 1]) and _unit_content(text[denominator + 1 : end - 1])):
        return None
    return len(head) - len("\\frac")


def _text_group_is_unit(group: str) -> bool:
    content = group[group.index("{") + 1 : -1]
    letters = _TEXT_CONTENT_NOISE.sub("", content)
    words = [w for w in re.split(r"[\s/.~*]+|\\[,;:! ]|\\cdot", content) if w]
    if len(letters) == 1 and letters not in _SINGLE_LETTER_UNITS:
        return False  # `\mathrm{e}`, `\text{i}`, `\mathrm{d}`: constants and differentials, not units
    return bool(letters) and letters.isalpha() and not any(w.lower() in ("or", "and") for w in words)


def _skip_separators(text: str, end: int) -> int:
    """Index where the run of spacing and unit separators ending at `end` starts."""
    while end > 0:
        if text[end - 1].isspace() or text[end - 1] in "/~*":
            end -= 1
            continue
        for command in _SEPARATOR_COMMANDS:
            if text.endswith(command, 0, end) and not (
                command[-1].isalpha() and end < len(text) and text[end].isalpha()
            ):
                end -= len(command)
                break
        else:
            return end
    return end


def _word_start(text: str, end: int) -> int:
    """Start of the unit token ending at `end`: letters, `/`-joined letter runs, one trailing dot."""
    i = end
    if i > 0 and text[i - 1] == ".":
        i -= 1
    while i > 0 and (
        text[i - 1].isalpha() and text[i - 1].isascii() or (text[i - 1] == "/" and i - 1 > 0 and text[i - 2].isalpha())
    ):
        i -= 1
    while i < end and text[i] == "/":
        i += 1
    return i


def _peel(text: str) -> str:
    """text without its trailing unit, or text unchanged when it has none."""
    end = len(text.rstrip())
    head_end = None
    while end > 0:
        end = _skip_separators(text, end)
        exponent = _TRAILING_EXPONENT.search(text[max(0, end - 12) : end])
        if exponent:
            end -= len(exponent.group())
        if end > 0 and text[end - 1] == "}":
            start = _text_group_start(text, end)
            if start is None or not _text_group_is_unit(text[start:end]):
                start = _unit_fraction_start(text, end)
            if start is None:
                break
        else:
            start = _word_start(text, end)
            token = text[start:end]
            if not token.strip(".") or (start > 0 and text[start - 1] == "\\") or not _bare_unit(token):
                break
        end = start
        head_end = end
    if head_end is None:
        return text
    head = text[: _skip_separators(text, head_end)].rstrip()
    return head if any(ch.isdigit() for ch in head) else text


def strip_units(text: str) -> str:
    """The value without a trailing unit (text groups, unit words, compounds such as m/s^2)."""
    return _peel(text)
