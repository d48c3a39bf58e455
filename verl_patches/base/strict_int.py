"""Integers typed by a user (command-line flags, cluster settings, step numbers in files): ASCII digits, nothing else.

`int()` accepts " 16", "1_6", "١٦" (Arabic-Indic digits) and 5000-digit numbers; argparse's ``type=int`` and
`str.isdigit()` inherit that (``str.isdigit()`` accepts '²', which ``int()`` then refuses). Here a step number
is 1 to `MAX_STEP_DIGITS` ASCII digits (`parse_step_int`, also what a checkpoint tracker file holds), and a
signed integer is an optional '-' then such digits (`parse_int`), so every reader takes the same text the same
way. Every refusal is one line naming its source; the text shown is cut and escaped.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

MAX_STEP_DIGITS = 12  # 10**12 steps: far beyond any run, small enough that no parser limit is reached


class StepNumberError(ValueError):
    """A step or iteration number that is not 1..12 ASCII digits; the message is one line naming its source."""


class IntError(ValueError):
    """Not a strict integer, or out of range; the message is one line naming its source."""


def shown(text: str | bytes) -> str:
    """At most 40 characters of ``text``, escaped, so a refusal stays one short line."""
    cut = text[:40]
    return repr(cut) + ("..." if len(text) > 40 else "")


def is_step_digits(text: str) -> bool:
    """1 to `MAX_STEP_DIGITS` ASCII digits and nothing else."""
    return 0 < len(text) <= MAX_STEP_DIGITS and all("0" <= c <= "9" for c in text)


def parse_step_int(text: str | bytes, what: str) -> int:
    """``text`` as a step number: 1 to 12 ASCII digits, nothing else (no sign, space, '_', '²').

    ``what`` names the source in the error (a flag such as ``--iteration``, a file and key).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise StepNumberError(
                f"{what}: expected a step number (ASCII digits), got non-ASCII bytes {shown(text)}"
            ) from None
    if not isinstance(text, str):
        raise StepNumberError(f"{what}: expected a step number, got {type(text).__name__}")
    if not is_step_digits(text):
        raise StepNumberError(
            f"{what}: expected a step number (1 to {MAX_STEP_DIGITS} ASCII digits), got {shown(text)}"
        )
    return int(text)


def parse_int(text: object, what: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``text`` as an integer (``-`` then 1 to 12 ASCII digits), within [minimum, maximum] when given."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise IntError(f"{what}: expected an integer, got {type(text).__name__}")
    if isinstance(text, int):
        value = text
    else:
        negative = text.startswith("-")
        digits = text[1:] if negative else text
        if not is_step_digits(digits):
            raise IntError(f"{what}: expected an integer, got {shown(text)}")
        value = -int(digits) if negative else int(digits)
    if minimum is not None and value < minimum:
        raise IntError(f"{what}: must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise IntError(f"{what}: must be at most {maximum}, got {value}")
    return value


def int_arg(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=`` that refuses anything `parse_int` refuses (argparse prints one usage line)."""

    def convert(text: str) -> int:
        try:
            return parse_int(text, "value", minimum, maximum)
        except IntError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None

    convert.__name__ = "integer"  # argparse names the type in its message: "invalid integer value"
    return convert
