"""Numbers typed by a user (a flag's seconds, MiB, GiB): finite decimals in a stated range, nothing else.

``float()`` accepts "nan", "inf", "1_0", " 1" and non-ASCII digits ("١"); argparse's ``type=float`` inherits
that, and a ``nan`` then passes every ``x <= 0`` test while a timer or a size made from it fails later with a
traceback. Here a number is ASCII decimal text (an optional sign, digits with at most one point, an optional
exponent) whose value is finite and inside the range the caller states. Every refusal is one line. This is
the one parser of number flags (`float_arg`): the tools' own copies were moved here.
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


_Bounds = tuple[float | None, float | None, float | None, float | None]  # above, at_least, at_most, below


def _range_problem(value: float, bounds: _Bounds) -> str | None:
    """The range a value misses, in words ("above 0 and below 1"), or None when it is inside."""
    above, at_least, at_most, below = bounds
    inside = (
        (above is None or value > above)
        and (at_least is None or value >= at_least)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    )
    if inside:
        return None
    named = (("above", above), ("at least", at_least), ("at most", at_most), ("below", below))
    return " and ".join(f"{word} {_shown_bound(bound)}" for word, bound in named if bound is not None)


def _shown_bound(bound: float) -> str:
    """A bound short (1e+06) where that is exact, else in full (1048576, not 1.04858e+06)."""
    short = f"{bound:g}"
    if float(short) == bound:
        return short
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def _bounds(above: float | None, at_most: float | None, at_least: float | None, below: float | None) -> _Bounds:
    if (above is None) == (at_least is None) or (at_most is not None and below is not None):
        raise TypeError("finite_float: one lower bound (above or at_least) and at most one upper (at_most or below)")
    return above, at_least, at_most, below


def parse_finite_float(
    text: object,
    what: str,
    above: float | None = None,
    at_most: float | None = None,
    *,
    at_least: float | None = None,
    below: float | None = None,
) -> float:
    """``text`` as a finite number inside the stated range (``what`` names the source): one lower bound,
    ``above`` (excluded) or ``at_least``, and at most one upper, ``at_most`` or ``below`` (excluded); with
    no upper bound any finite number above the lower one is in range."""
    bounds = _bounds(above, at_most, at_least, below)
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise FloatError(f"{what}: expected a number, got {type(text).__name__}")
    if isinstance(text, str):
        if len(text) > 64 or not _DECIMAL.fullmatch(text):
            raise FloatError(f"{what}: expected a finite decimal number, got {shown(text)}")
        text = float(text)
    value = float(text)
    if not math.isfinite(value):
        raise FloatError(f"{what}: expected a finite number, got {value}")
    if missed := _range_problem(value, bounds):
        raise FloatError(f"{what}: must be {missed}, got {value:g}")
    return value


def float_arg(
    above: float | None = None,
    at_most: float | None = None,
    *,
    at_least: float | None = None,
    below: float | None = None,
) -> Callable[[str], float]:
    """An argparse ``type=`` that refuses anything `parse_finite_float` refuses with the same bounds (nan, inf,
    out of range); argparse makes the refusal one usage line naming the flag, exit status 2."""
    _bounds(above, at_most, at_least, below)  # a wrong call fails where the flag is declared

    def convert(text: str) -> float:
        try:
            return parse_finite_float(text, "value", above, at_most, at_least=at_least, below=below)
        except FloatError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None

    convert.__name__ = "number"  # argparse names the type in its message: "invalid number value"
    return convert
