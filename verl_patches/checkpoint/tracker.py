"""The one reader of checkpoint tracker files (``latest_checkpointed_iteration.txt``); step numbers themselves
are parsed by `verl_patches.base.strict_int.parse_step_int`, with the same digits rule.

``str.isdigit()`` accepts '²' and other Unicode digits that ``int()`` then refuses, and ``int()`` accepts
5000 digits, signs, spaces and underscores; a tracker is one line of at most `MAX_STEP_DIGITS` ASCII digits
and nothing else. Every refusal is one line naming the file (or the flag/key) at fault; the content shown is
cut and escaped, and nothing is read from a path that is not a regular file (a symlinked tracker could
point anywhere, a FIFO would block). Standard library only (no torch), no import-time work.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.base.strict_int import MAX_STEP_DIGITS, StepNumberError
from verl_patches.base.strict_int import is_step_digits as _is_step_digits
from verl_patches.base.strict_int import shown as _shown

MAX_TRACKER_BYTES = 64  # a tracker holds one short line; anything longer is not one
RELEASE: Final = "release"  # Megatron's tracker word for a checkpoint without an iteration number


class TrackerError(StepNumberError):
    """A tracker file that is missing, not a regular file, or not one line of a step number; names the file."""


def _tracker_text(path: str | os.PathLike[str]) -> str:
    try:
        data = read_regular_file(Path(path), max_bytes=MAX_TRACKER_BYTES, follow_symlinks=False)
    except FileRefused as err:
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


def read_tracker(path: str | os.PathLike[str]) -> int:
    """The step number a tracker file holds: one line of 1 to 12 ASCII digits (a trailing newline and
    surrounding spaces are tolerated). TrackerError, one line naming ``path``, for anything else."""
    text = _tracker_text(path)
    if not _is_step_digits(text):
        raise TrackerError(f"{path}: expected a step number (1 to {MAX_STEP_DIGITS} ASCII digits), got {_shown(text)}")
    return int(text)


def read_megatron_tracker(path: str | os.PathLike[str]) -> int | Literal["release"]:
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
