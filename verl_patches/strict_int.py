"""Integers typed by a user (command-line flags, cluster settings): ASCII digits with an optional '-', nothing else.

`int()` accepts " 16", "1_6", "١٦" (Arabic-Indic digits) and 5000-digit numbers; argparse's ``type=int`` and
`str.isdigit()` inherit that. The digits go through the one strict step-number parser
(`verl_patches.checkpoint.tracker.parse_step_int`), so both read the same text the same way.
"""

from __future__ import annotations

import argparse
from typing import Callable

from verl_patches.checkpoint.tracker import StepNumberError, parse_step_int


class IntError(ValueError):
    """Not a strict integer, or out of range; the message is one line naming its source."""


def parse_int(text: object, what: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """``text`` as an integer (``-`` then 1 to 12 ASCII digits), within [minimum, maximum] when given."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        raise IntError(f"{what}: expected an integer, got {type(text).__name__}")
    if isinstance(text, int):
        value = text
    else:
        negative = text.startswith("-")
        try:
            value = parse_step_int(text[1:] if negative else text, what)
        except StepNumberError:
            shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
            raise IntError(f"{what}: expected an integer, got {shown}") from None
        value = -value if negative else value
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
