"""The one strict reader of step numbers: tracker files (``latest_checkpointed_iteration.txt``) and step or
iteration integers given on a command line or read from a file.

``str.isdigit()`` accepts '²' and other Unicode digits that ``int()`` then refuses, and ``int()`` accepts
5000 digits, signs, spaces and underscores; a tracker is one line of at most `MAX_STEP_DIGITS` ASCII digits
and nothing else. Every refusal is one line naming the file (or the flag/key) at fault; the content shown is
cut and escaped, and nothing is read from a path that is not a regular file (a symlinked tracker could
point anywhere, a FIFO would block). Pure standard library, no import-time work.
"""
from __future__ import annotations

import os
import stat
from typing import Literal

MAX_STEP_DIGITS = 12  # 10**12 steps: far beyond any run, small enough that no parser limit is reached
MAX_TRACKER_BYTES = 64  # a tracker holds one short line; anything longer is not one
RELEASE = "release"  # Megatron's tracker word for a checkpoint without an iteration number


class StepNumberError(ValueError):
    """A step or iteration number that is not 1..12 ASCII digits; the message is one line naming its source."""


class TrackerError(StepNumberError):
    """A tracker file that is missing, not a regular file, or not one line of a step number; names the file."""


def _shown(text: str | bytes) -> str:
    """At most 40 characters of ``text``, escaped, so a refusal stays one short line."""
    cut = text[:40]
    return repr(cut) + ("..." if len(text) > 40 else "")


def _is_step_digits(text: str) -> bool:
    return 0 < len(text) <= MAX_STEP_DIGITS and all("0" <= c <= "9" for c in text)


def parse_step_int(text: str | bytes, what: str) -> int:
    """``text`` as a step number: 1 to 12 ASCII digits, nothing else (no sign, space, '_', '²').

    ``what`` names the source in the error (a flag such as ``--iteration``, a file and key).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("ascii")
        except UnicodeDecodeError:
            raise StepNumberError(f"{what}: expected a step number (ASCII digits), got non-ASCII bytes "
                                  f"{_shown(text)}") from None
    if not isinstance(text, str):
        raise StepNumberError(f"{what}: expected a step number, got {type(text).__name__}")
    if not _is_step_digits(text):
        raise StepNumberError(f"{what}: expected a step number (1 to {MAX_STEP_DIGITS} ASCII digits), "
                              f"got {_shown(text)}")
    return int(text)


def _read_small_regular_file(path: str | os.PathLike) -> bytes:
    """The bytes of a regular file of at most `MAX_TRACKER_BYTES`; TrackerError naming ``path`` otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise TrackerError(f"{path}: missing") from None
    except OSError as err:
        raise TrackerError(f"{path}: cannot be read ({err.strerror})") from None
    if stat.S_ISLNK(st.st_mode):
        raise TrackerError(f"{path}: is a symbolic link; a tracker is a regular file written by the trainer")
    if not stat.S_ISREG(st.st_mode):
        raise TrackerError(f"{path}: not a regular file")
    if st.st_size > MAX_TRACKER_BYTES:
        raise TrackerError(f"{path}: {st.st_size} bytes; a tracker is one line of at most {MAX_STEP_DIGITS} digits")
    try:
        # O_NOFOLLOW and O_NONBLOCK: a file swapped for a link or a FIFO after the lstat is refused, not followed
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise TrackerError(f"{path}: cannot be read ({err.strerror})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TrackerError(f"{path}: not a regular file")
        data = os.read(fd, MAX_TRACKER_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_TRACKER_BYTES:
        raise TrackerError(f"{path}: longer than {MAX_TRACKER_BYTES} bytes; a tracker is one short line")
    return data


def _tracker_text(path: str | os.PathLike) -> str:
    data = _read_small_regular_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TrackerError(f"{path}: not UTF-8 text ({_shown(data)})") from None
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    if "\n" in text or "\r" in text:
        raise TrackerError(f"{path}: more than one line ({_shown(text)})")
    return text.strip(" \t")


def read_tracker(path: str | os.PathLike) -> int:
    """The step number a tracker file holds: one line of 1 to 12 ASCII digits (a trailing newline and
    surrounding spaces are tolerated). TrackerError, one line naming ``path``, for anything else."""
    text = _tracker_text(path)
    if not _is_step_digits(text):
        raise TrackerError(f"{path}: expected a step number (1 to {MAX_STEP_DIGITS} ASCII digits), got {_shown(text)}")
    return int(text)


def read_megatron_tracker(path: str | os.PathLike) -> int | Literal["release"]:
    """As `read_tracker`, also accepting Megatron's word ``release``."""
    text = _tracker_text(path)
    if text == RELEASE:
        return RELEASE
    if not _is_step_digits(text):
        raise TrackerError(f"{path}: expected an iteration number (1 to {MAX_STEP_DIGITS} ASCII digits) or "
                           f"'{RELEASE}', got {_shown(text)}")
    return int(text)
