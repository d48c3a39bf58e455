"""verl_patches.base.strict_int: the one reader of integers a user types and step numbers a file holds."""

from __future__ import annotations

import argparse

import pytest

from verl_patches.base.strict_int import (
    MAX_STEP_DIGITS,
    IntError,
    StepNumberError,
    int_arg,
    parse_int,
    parse_step_int,
)


@pytest.mark.parametrize("text", [" 16", "1_6", "\u0661\u0666", "16 ", "+16", "0x10", "1e3", "", "-", "--1", "1" * 13])
def test_what_int_accepts_and_we_refuse(text: str) -> None:
    with pytest.raises(IntError) as e:
        parse_int(text, "--tp")
    assert str(e.value).startswith("--tp: expected an integer, got ") and len(str(e.value)) < 120


def test_signed_integers_and_ranges() -> None:
    assert parse_int("-7", "x") == -7 and parse_int("0", "x") == 0 and parse_int(5, "x") == 5
    assert parse_int("9" * MAX_STEP_DIGITS, "x") == int("9" * MAX_STEP_DIGITS)
    with pytest.raises(IntError, match="^--pp: must be at least 1, got 0$"):
        parse_int("0", "--pp", minimum=1)
    with pytest.raises(IntError, match="^--pp: must be at most 4, got 5$"):
        parse_int("5", "--pp", maximum=4)
    for wrong in (True, 1.0, None, b"1"):
        with pytest.raises(IntError, match="x: expected an integer, got "):
            parse_int(wrong, "x")


def test_step_numbers_have_no_sign_and_take_ascii_bytes() -> None:
    assert parse_step_int("42", "it") == 42 and parse_step_int(b"007", "it") == 7
    for bad in ("-1", "²", b"\xb2", "4 2", ""):
        with pytest.raises(StepNumberError, match="^--iteration: "):
            parse_step_int(bad, "--iteration")


def test_argparse_type_prints_one_usage_line() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int_arg(minimum=1))
    assert p.parse_args(["--tp", "8"]).tp == 8
    convert = int_arg(minimum=1)
    assert convert.__name__ == "integer"
    with pytest.raises(argparse.ArgumentTypeError, match="^must be at least 1, got 0$"):
        convert("0")
    with pytest.raises(argparse.ArgumentTypeError, match="^expected an integer, got '١'$"):
        convert("\u0661")
