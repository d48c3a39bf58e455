"""Pure planning of checkpoint folders: names, the checkpoint to resume from, what to prune.

Nothing here touches the disk: callers pass a listing (folder name -> whether its step manifest is
present and valid) and the tracker's text, and act on the returned plan.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Mapping

STEP_PREFIX = "global_step_"
STAGING_PREFIX = ".staging-"  # + step folder name: a save in progress (or interrupted)
TRASH_PREFIX = ".trash-"  # + step folder name: a folder being deleted
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's name for the root's tracker

_STEP_RE = re.compile(r"^global_step_(\d+)$")


def step_dir_name(step: int) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise ValueError(f"checkpoint step must be a non-negative integer, got {step!r}")
    return f"{STEP_PREFIX}{step}"


def staging_dir_name(step: int) -> str:
    return STAGING_PREFIX + step_dir_name(step)


def parse_step_dir(name: str) -> int | None:
    """The step of a committed step folder's name, or None for anything else."""
    m = _STEP_RE.match(name)
    return int(m.group(1)) if m else None


def is_save_step(step: int, save_freq: int, is_last_step: bool) -> bool:
    """verl's rule: every ``save_freq`` steps and at the last step; ``save_freq <= 0`` never saves."""
    return save_freq > 0 and (is_last_step or step % save_freq == 0)


def parse_tracker(text: str | None) -> int | None:
    """The tracker's step, or None when absent or unreadable (the scan then decides)."""
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class ResumePoint:
    step: int
    name: str
    note: str  # empty, or why this is not what the tracker says


def choose_resume(listing: Mapping[str, bool], tracker_text: str | None) -> ResumePoint | None:
    """The newest complete checkpoint, preferring the tracker's.

    ``listing`` maps folder names to "complete" (its step manifest is valid). The tracker is written after
    the rename, so it can only lag: when it names a missing or incomplete folder, or is older than a
    complete folder (a kill between rename and tracker write), the newest complete folder wins.
    """
    complete = sorted((s, n) for n, ok in listing.items() if ok and (s := parse_step_dir(n)) is not None)
    if not complete:
        return None
    step, name = complete[-1]
    tracked = parse_tracker(tracker_text)
    if tracked == step:
        return ResumePoint(step, name, "")
    if tracker_text is None:
        note = f"no {TRACKER_FILE}; newest complete checkpoint used"
    elif tracked is None:
        note = f"{TRACKER_FILE} is unreadable ({tracker_text.strip()[:40]!r}); newest complete checkpoint used"
    elif step_dir_name(tracked) in listing and not listing[step_dir_name(tracked)]:
        note = f"{TRACKER_FILE} names step {tracked}, whose checkpoint is incomplete; newest complete one used"
    elif tracked > step or step_dir_name(tracked) not in listing:
        note = f"{TRACKER_FILE} names step {tracked}, which is not a complete checkpoint; newest complete one used"
    else:
        note = f"{TRACKER_FILE} names step {tracked}, a newer checkpoint was committed after it"
    return ResumePoint(step, name, note)


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[str, ...]  # folder names, oldest first
    keep: tuple[str, ...]


def plan_prune(listing: Mapping[str, bool], keep_last: int | None, protect: Iterable[str] = ()) -> PrunePlan:
    """Which folders to delete after a commit.

    Keeps the ``keep_last`` newest complete checkpoints (all when ``keep_last`` is None or <= 0) and every
    name in ``protect`` (the one just committed). Deletes older complete ones, interrupted staging and
    trash folders. A step folder without a valid manifest is never ours (ours appear by rename, complete)
    and is left alone.
    """
    protect = set(protect)
    complete = sorted((s, n) for n, ok in listing.items() if ok and (s := parse_step_dir(n)) is not None)
    kept = [n for _, n in complete] if not keep_last or keep_last <= 0 else [n for _, n in complete[-keep_last:]]
    delete: list[tuple[int, str]] = []
    for name, ok in listing.items():
        if name in protect or name in kept:
            continue
        step = parse_step_dir(name)
        if step is not None:
            if ok:
                delete.append((step, name))
        elif name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX):
            delete.append((-1, name))
    delete.sort()
    return PrunePlan(delete=tuple(n for _, n in delete), keep=tuple(sorted(set(kept) | (protect & set(listing)))))
