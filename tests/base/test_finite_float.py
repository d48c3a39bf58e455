"""verl_patches/base/finite_float.py: the one parser of number flags (finite decimals in a stated range)."""

from __future__ import annotations

import argparse
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_patches.base.finite_float import FloatError, float_arg, parse_finite_float


@pytest.mark.parametrize(
    "bounds,text,message",
    [
        (dict(above=0, at_most=10), "0", "must be above 0 and at most 10, got 0"),
        (dict(above=0, at_most=10), "10.5", "must be above 0 and at most 10, got 10.5"),
        (dict(above=0, below=1), "1", "must be above 0 and below 1, got 1"),
        (dict(at_least=0.001, at_most=1024), "0.0005", "must be at least 0.001 and at most 1024, got 0.0005"),
        (dict(above=0), "-1", "must be above 0, got -1"),
        (dict(above=0, below=1 << 20), "0", "must be above 0 and below 1048576, got 0"),
        (dict(above=0, at_most=10**6), "-1", "must be above 0 and at most 1e+06, got -1"),
        (dict(above=0), "nan", "expected a finite decimal number, got 'nan'"),
        (dict(above=0), "inf", "expected a finite decimal number, got 'inf'"),
        (dict(above=0), "1e400", "expected a finite number, got inf"),
        (dict(above=0), "1_0", "expected a finite decimal number, got '1_0'"),
        (dict(above=0), " 1", "expected a finite decimal number, got ' 1'"),
    ],
)
def test_refusals_are_one_line_naming_the_range(bounds, text, message):
    with pytest.raises(FloatError) as err:
        parse_finite_float(text, "--x", **bounds)
    assert str(err.value) == f"--x: {message}"
    with pytest.raises(argparse.ArgumentTypeError, match=f"^{re.escape(message)}$"):
        float_arg(**bounds)(text)


@pytest.mark.parametrize(
    "bounds,inside",
    [
        (dict(above=0, at_most=10), ["10", "1e-9", "3.5"]),
        (dict(above=0, below=1), ["0.5", ".999"]),
        (dict(at_least=0.001, at_most=1024), ["0.001", "1024", "5"]),
        (dict(above=0), ["1e300", "0.1"]),
    ],
)
def test_the_bounds_are_open_or_closed_as_named(bounds, inside):
    for text in inside:
        assert float_arg(**bounds)(text) == float(text)


@pytest.mark.parametrize(
    "bounds", [dict(), dict(above=0, at_least=0), dict(above=0, at_most=1, below=2), dict(at_most=1)]
)
def test_a_flag_declared_without_one_lower_bound_is_a_programming_error(bounds):
    with pytest.raises(TypeError, match="one lower bound"):
        float_arg(**bounds)


@given(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["above", "at_least"]), st.booleans())
def test_whatever_passes_is_finite_and_inside(value, lower, below):
    bounds = {lower: 0.0, ("below" if below else "at_most"): 100.0}
    try:
        got = float_arg(**bounds)(repr(value))
    except argparse.ArgumentTypeError as err:
        assert "\n" not in str(err)
        return
    assert math.isfinite(got) and got == value
    assert (got > 0 if lower == "above" else got >= 0) and (got < 100 if below else got <= 100)
