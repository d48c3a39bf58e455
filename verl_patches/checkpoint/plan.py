"""Pure planning of checkpoint folders: names, the checkpoint to resume from, what to prune.

Nothing here touches the disk: callers pass a listing (folder name -> `Entry`: whether it is a complete
checkpoint, whether this checkpoint root's saves created it, and why not complete) and the tracker's
step (or why it could not be read), and act on the returned plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

STEP_PREFIX = "global_step_"
STAGING_PREFIX = ".staging-"  # + step folder name: a save in progress (or interrupted)
TRASH_PREFIX = ".trash-"  # + the root's owner nonce + '.': a folder being deleted
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's name for the root's tracker

# canonical names only (no leading zeros: two names of one step would be two checkpoints of it)
_STEP_RE = re.compile(r"global_step_(0|[1-9][0-9]{0,11})")


@dataclass(frozen=True)
class Entry:
    """One folder of a checkpoint root as the planner sees it."""

    complete: bool = False  # a step folder whose manifest is valid and whose files have their recorded sizes
    ours: bool = False  # created by this root's saves (its owner marker holds the root's nonce)
    problem: str = ""  # why a step folder is not complete (one line), for the resume's note


def step_dir_name(step: int) -> str:
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < 10**12:
        raise ValueError(f"checkpoint step must be an integer in 0..999999999999, got {step!r}")
    return f"{STEP_PREFIX}{step}"


def staging_dir_name(step: int) -> str:
    return STAGING_PREFIX + step_dir_name(step)


def parse_step_dir(name: str) -> int | None:
    """The step of a committed step folder's name, or None for anything else."""
    m = _STEP_RE.fullmatch(name) if isinstance(name, str) else None
    return int(m.group(1)) if m else None


def is_save_step(step: int, save_freq: int, is_last_step: bool) -> bool:
    """verl's rule: every ``save_freq`` steps and at the last step; ``save_freq <= 0`` never saves."""
    return save_freq > 0 and (is_last_step or step % save_freq == 0)


@dataclass(frozen=True)
class ResumePoint:
    step: int
    name: str
    note: str  # empty, or why this is not what the tracker says


def _complete_steps(listing: Mapping[str, Entry], ours_only: bool = False) -> list[tuple[int, str]]:
    return sorted(
        (s, n)
        for n, e in listing.items()
        if e.complete and (e.ours or not ours_only) and (s := parse_step_dir(n)) is not None
    )


def choose_resume(listing: Mapping[str, Entry], tracked: int | None, tracker_problem: str = "") -> ResumePoint | None:
    """The newest complete checkpoint, preferring the tracker's.

    ``tracked`` is the tracker's step (None when absent or unreadable; ``tracker_problem`` then says why
    it is unreadable). The tracker is written after the rename, so it can only lag: when it names a
    missing or incomplete folder, or is older than a complete folder (a kill between rename and tracker
    write), the newest complete folder wins. Newer step folders that are not complete are named with why.
    """
    complete = _complete_steps(listing)
    if not complete:
        return None
    step, name = complete[-1]
    notes = []
    skipped = sorted(
        ((s, n) for n, e in listing.items() if not e.complete and (s := parse_step_dir(n)) is not None and s > step),
        reverse=True,
    )
    if skipped:
        s, n = skipped[0]
        more = f" (and {len(skipped) - 1} more)" if len(skipped) > 1 else ""
        notes.append(f"{n} skipped{more}: {listing[n].problem or 'incomplete'}")
    if tracked == step:
        pass
    elif tracked is None and not tracker_problem:
        notes.append(f"no {TRACKER_FILE}; newest complete checkpoint used")
    elif tracked is None:
        notes.append(f"{tracker_problem}; newest complete checkpoint used")
    elif step_dir_name(tracked) in listing and not listing[step_dir_name(tracked)].complete:
        if not skipped or skipped[0][0] != tracked:
            notes.append(
                f"{TRACKER_FILE} names step {tracked}, whose checkpoint is incomplete; newest complete one used"
            )
    elif tracked > step or step_dir_name(tracked) not in listing:
        notes.append(
            f"{TRACKER_FILE} names step {tracked}, which is not a complete checkpoint; newest complete one used"
        )
    else:
        notes.append(f"{TRACKER_FILE} names step {tracked}, a newer checkpoint was committed after it")
    return ResumePoint(step, name, "; ".join(notes))


@dataclass(frozen=True)
class PrunePlan:
    delete: tuple[str, ...]  # folder names, oldest first
    keep: tuple[str, ...]


def plan_prune(listing: Mapping[str, Entry], keep_last: int | None, protect: Iterable[str] = ()) -> PrunePlan:
    """Which folders to delete after a commit: only folders this root's saves created (``Entry.ours``).

    Keeps the ``keep_last`` newest complete checkpoints of ours (all when ``keep_last`` is None or <= 0)
    and every name in ``protect`` (the one just committed). Deletes our older complete ones and our
    interrupted staging and trash folders. A step folder that is not complete, and anything not ours
    (another tool's ``.staging-*``, a checkpoint copied in from another run, a symbolic link), is left alone.
    """
    protect = set(protect)
    complete = _complete_steps(listing, ours_only=True)
    kept = [n for _, n in complete] if not keep_last or keep_last <= 0 else [n for _, n in complete[-keep_last:]]
    delete: list[tuple[int, str]] = []
    for name, entry in listing.items():
        if name in protect or name in kept or not entry.ours:
            continue
        step = parse_step_dir(name)
        if step is not None:
            if entry.complete:
                delete.append((step, name))
        elif name.startswith(STAGING_PREFIX) or name.startswith(TRASH_PREFIX):
            delete.append((-1, name))
    delete.sort()
    return PrunePlan(delete=tuple(n for _, n in delete), keep=tuple(sorted(set(kept) | (protect & set(listing)))))
