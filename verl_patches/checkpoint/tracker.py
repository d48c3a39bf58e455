"""The one strict reader of step numbers: tracker files (``latest_checkpointed_iteration.txt``) and step or
iteration integers given on a command line or read from a file.

``str.isdigit()`` accepts '²' and other Unicode digits that ``int()`` then refuses, and ``int()`` accepts
5000 digits, signs, spaces and underscores; a tracker is one line of at most `MAX_STEP_DIGITS` ASCII digits
and nothing else. Every refusal is one line naming the file (or the flag/key) at fault; the content shown is
cut and escaped, and nothing is read from a path that is not a regular file (a symlinked tracker could
point anywhere, a FIFO would block). Standard library only (no torch), no import-time work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from verl_patches.checkpoint.confine import ConfinementError, read_regular_file

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
            raise StepNumberError(
                f"{what}: expected a step number (ASCII digits), got non-ASCII bytes {_shown(text)}"
            ) from None
    if not isinstance(text, str):
        raise StepNumberError(f"{what}: expected a step number, got {type(text).__name__}")
    if not _is_step_digits(text):
        raise StepNumberError(
            f"{what}: expected a step number (1 to {MAX_STEP_DIGITS} ASCII digits), got {_shown(text)}"
        )
    return int(text)


def _tracker_text(path: str | os.PathLike) -> str:
    try:
        data = read_regular_file(Path(path), MAX_TRACKER_BYTES)
    except ConfinementError as err:
        raise TrackerError(str(err)) from None
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
        raise TrackerError(
            f"{path}: expected an iteration number (1 to {MAX_STEP_DIGITS} ASCII digits) or "
            f"'{RELEASE}', got {_shown(text)}"
        )
    return int(text)
