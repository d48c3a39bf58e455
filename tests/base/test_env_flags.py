"""verl_patches.base.env_flags: one grammar for switches, typed getters, every refusal naming the variable."""

from __future__ import annotations

import re

import pytest

from verl_patches.base.env_flags import EnvError, env_flag, env_float, env_int, env_list, env_str, parse_flag

ON_SPELLINGS = ["1", "true", "yes", "on", "TRUE", "True", "Yes", "ON", " 1 ", "on\n"]
OFF_SPELLINGS = ["0", "false", "no", "off", "", "FALSE", "Off", " no ", "  "]


@pytest.mark.parametrize("value", ON_SPELLINGS)
def test_every_on_spelling(value: str) -> None:
    for default in (False, True):
        assert env_flag("D2D_DATA_TRANSFER", default=default, environ={"D2D_DATA_TRANSFER": value}) is True


@pytest.mark.parametrize("value", OFF_SPELLINGS)
def test_every_off_spelling(value: str) -> None:
    for default in (False, True):
        assert env_flag("PRINT_MEMORY", default=default, environ={"PRINT_MEMORY": value}) is False


def test_unset_is_the_default() -> None:
    assert env_flag("X", environ={}) is False
    assert env_flag("X", default=True, environ={}) is True
    assert env_flag("X", environ={"Y": "1"}) is False


@pytest.mark.parametrize("value", ["enabled", "2", "ture", "-1", "y", "disable", "1.0", "on off", "\u0661"])
def test_an_unknown_value_is_refused_with_the_variable_the_value_and_the_grammar(value: str) -> None:
    """`NO_ALL_TO_ALL_RESHARD=enabled` raised while `D2D_DATA_TRANSFER=enabled` turned the cache on: now
    both are the same error."""
    for name in ("NO_ALL_TO_ALL_RESHARD", "D2D_DATA_TRANSFER"):
        with pytest.raises(EnvError) as e:
            env_flag(name, environ={name: value})
        msg = str(e.value)
        assert msg.startswith(f"{name}={value!r}: expected ") and "\n" not in msg
        assert "1, true, yes, on (on)" in msg and "0, false, no, off, empty (off)" in msg
        assert isinstance(e.value, ValueError)


def test_the_process_environment_is_the_default_mapping(monkeypatch) -> None:
    monkeypatch.setenv("VERL_PATCHES_TEST_SWITCH", "yes")
    assert env_flag("VERL_PATCHES_TEST_SWITCH") is True
    monkeypatch.setenv("VERL_PATCHES_TEST_SWITCH", "maybe")
    with pytest.raises(EnvError, match="VERL_PATCHES_TEST_SWITCH='maybe'"):
        env_flag("VERL_PATCHES_TEST_SWITCH")
    assert parse_flag("X", "Off") is False


def test_integers_are_strict_and_bounded() -> None:
    assert env_int("RANK", 0, environ={}) == 0
    assert env_int("RANK", 0, environ={"RANK": ""}) == 0
    assert env_int("RANK", 0, environ={"RANK": " 12 "}) == 12
    assert env_int("OFFSET", 0, environ={"OFFSET": "-3"}) == -3
    for bad in ("1_0", "0x10", "1.5", "\u0661", "1" * 13, "+1", "two"):
        with pytest.raises(EnvError) as e:
            env_int("RANK", 0, environ={"RANK": bad})
        assert str(e.value) == f"RANK={bad!r}: expected an integer (an optional '-' and 1 to 12 ASCII digits)"
    with pytest.raises(EnvError, match=r"^VERL_PATCHES_DIES_PER_CARD='0': must be at least 1, got 0$"):
        env_int("VERL_PATCHES_DIES_PER_CARD", 1, minimum=1, environ={"VERL_PATCHES_DIES_PER_CARD": "0"})
    with pytest.raises(EnvError, match="must be at most 8"):
        env_int("N", 1, maximum=8, environ={"N": "9"})


def test_floats_are_finite_and_bounded() -> None:
    assert env_float("T", 60.0, environ={}) == 60.0
    assert env_float("T", 60.0, environ={"T": " 30 "}) == 30.0
    assert env_float("T", 60.0, environ={"T": "1.5e2"}) == 150.0
    for bad, why in (("soon", "expected a number"), ("nan", "finite"), ("inf", "finite"), ("-1", "at least 0")):
        with pytest.raises(EnvError, match=rf"^{re.escape(f'T={bad!r}')}: .*{why}"):
            env_float("T", 60.0, minimum=0.0, environ={"T": bad})


def test_lists_and_strings() -> None:
    assert env_list("M", environ={"M": " a, b,,c ,"}) == ["a", "b", "c"]
    assert env_list("M", environ={}) == []
    assert env_list("P", sep=":", environ={"P": "x::y"}) == ["x", "y"]
    assert env_str("S", "d", environ={"S": "  "}) == "d" and env_str("S", environ={"S": " v "}) == "v"
