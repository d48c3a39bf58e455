"""Numbers typed by a user (a flag's seconds, MiB, GiB): finite decimals in a stated range, nothing else.

``float()`` accepts "nan", "inf", "1_0", " 1" and non-ASCII digits ("١"); argparse's ``type=float`` inherits
that, and a ``nan`` then passes every ``x <= 0`` test while a timer or a size made from it fails later with a
traceback. Here a number is ASCII decimal text (an optional sign, digits with at most one point, an optional
exponent) whose value is finite and inside the range the caller states. Every refusal is one line.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from verl_patches.base.strict_int import shown

_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?")


class FloatError(ValueError):
    """Not a finite decimal number, or out of range; the message is one line naming its source."""


def parse_finite_float(text: object, what: str, above: float, at_most: float) -> float:
    """``text`` as a finite number with ``above < value <= at_most`` (``what`` names the source)."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise FloatError(f"{what}: expected a number, got {type(text).__name__}")
    if isinstance(text, str):
        if len(text) > 64 or not _DECIMAL.fullmatch(text):
            raise FloatError(f"{what}: expected a finite decimal number, got {shown(text)}")
        text = float(text)
    value = float(text)
    if not math.isfinite(value):
        raise FloatError(f"{what}: expected a finite number, got {value}")
    if not above < value <= at_most:
        raise FloatError(f"{what}: must be above {above:g} and at most {at_most:g}, got {value:g}")
    return value


def float_arg(above: float, at_most: float) -> Callable[[str], float]:
    """An argparse ``type=`` that refuses anything `parse_finite_float` refuses (nan, inf, out of range)."""

    def convert(text: str) -> float:
        try:
            return parse_finite_float(text, "value", above, at_most)
        except FloatError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None

    convert.__name__ = "number"  # argparse names the type in its message: "invalid number value"
    return convert
