"""The one strict tracker and step-number parser (issue #27): ASCII digits, bounded, UTF-8, one line, a regular
file; every refusal one line naming the file (or flag)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verl_patches.base.strict_int import StepNumberError, parse_step_int
from verl_patches.checkpoint.tracker import TrackerError, read_megatron_tracker, read_tracker


@pytest.mark.parametrize(
    "content,step",
    [(b"12", 12), (b"12\n", 12), (b"12\r\n", 12), (b" 7\t", 7), (b"0", 0), (b"999999999999", 999999999999)],
)
def test_accepted(tmp_path: Path, content: bytes, step: int) -> None:
    p = tmp_path / "t.txt"
    p.write_bytes(content)
    assert read_tracker(p) == step and read_megatron_tracker(p) == step


@pytest.mark.parametrize(
    "content,needle",
    [
        ("²".encode(), "expected a step number (1 to 12 ASCII digits), got '²'"),
        ("١٢".encode(), "got '١٢'"),  # Arabic-Indic digits: str.isdigit() is true for them too
        (b"9" * 5000, "5000 bytes, more than the 64"),
        (b"9" * 13, "got '9999999999999'"),
        (b"\xff\xfe\x00", "not UTF-8 text (b'\\xff\\xfe\\x00')"),
        (b"1\n2", "more than one line"),
        (b"", "got ''"),
        (b"-1", "got '-1'"),
        (b"1_000", "got '1_000'"),
        (b"release", "got 'release'"),
    ],
)
def test_refused_with_one_line_naming_the_file(tmp_path: Path, content: bytes, needle: str) -> None:
    p = tmp_path / "t.txt"
    p.write_bytes(content)
    with pytest.raises(TrackerError) as e:
        read_tracker(p)
    assert str(e.value).startswith(f"{p}: ") and needle in str(e.value) and "\n" not in str(e.value)


def test_megatron_release(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("release\n")
    assert read_megatron_tracker(p) == "release"
    p.write_text("releases")
    with pytest.raises(TrackerError, match="or 'release', got 'releases'"):
        read_megatron_tracker(p)


def test_not_regular_files_are_refused_unread(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("4")
    cases = {
        "no such file": tmp_path / "none",
        "symbolic link": tmp_path / "link",
        "not a regular file": tmp_path / "dir",
        "not a regular file ": tmp_path / "fifo",
    }
    os.symlink(secret, cases["symbolic link"])
    cases["not a regular file"].mkdir()
    os.mkfifo(cases["not a regular file "])  # reading would block: refused before opening
    for needle, p in cases.items():
        with pytest.raises(TrackerError, match=needle.strip()) as e:
            read_tracker(p)
        assert str(e.value).startswith(str(p)) and "4" not in str(e.value).replace(str(p), "")


@pytest.mark.parametrize("text", ["²", "1_0", " 1", "+1", "0x10", "1" * 13, "", "1.0", b"\xb2", "١"])
def test_step_int_refusals(text) -> None:
    with pytest.raises(StepNumberError, match="^--iteration: ") as e:
        parse_step_int(text, "--iteration")
    assert "\n" not in str(e.value)


def test_step_int_accepts_ascii_digits() -> None:
    assert parse_step_int("42", "x") == 42 and parse_step_int(b"007", "x") == 7
    assert issubclass(TrackerError, StepNumberError) and issubclass(StepNumberError, ValueError)
