"""Pure planning: folder names, the checkpoint to resume from, what keep-last deletes."""
from __future__ import annotations

import itertools

import pytest

from verl_patches.checkpoint.plan import (ResumePoint, choose_resume, is_save_step, parse_step_dir, parse_tracker,
                                          plan_prune, staging_dir_name, step_dir_name)


def test_names_round_trip_and_reject_other_folders() -> None:
    for step in (0, 1, 7, 1234567):
        assert parse_step_dir(step_dir_name(step)) == step
        assert parse_step_dir(staging_dir_name(step)) is None
    for name in ("global_step_", "global_step_-1", "global_step_1x", "xglobal_step_1", ".trash-global_step_3",
                 "global_step_1/actor", "global_step_ 1"):
        assert parse_step_dir(name) is None, name
    for bad in (-1, 1.0, True, "3"):
        with pytest.raises(ValueError):
            step_dir_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("freq", [-1, 0, 1, 2, 3])
def test_is_save_step_matches_verl(freq: int) -> None:
    total = 7
    for step in range(1, total + 1):
        last = step == total
        assert is_save_step(step, freq, last) == (freq > 0 and (last or step % freq == 0))


def test_parse_tracker() -> None:
    assert parse_tracker(None) is None
    assert parse_tracker("12\n") == 12
    assert parse_tracker(" 3 ") == 3
    assert parse_tracker("release") is None and parse_tracker("") is None and parse_tracker("-2") is None


def test_resume_prefers_tracker_when_it_is_the_newest_complete() -> None:
    listing = {"global_step_2": True, "global_step_4": True}
    assert choose_resume(listing, "4") == ResumePoint(4, "global_step_4", "")


def test_resume_from_scratch_when_nothing_is_complete() -> None:
    assert choose_resume({}, None) is None
    assert choose_resume({"global_step_2": False, ".staging-global_step_4": False}, "2") is None


@pytest.mark.parametrize("tracker,needle", [
    (None, "no latest_checkpointed_iteration.txt"),
    ("junk", "unreadable"),
    ("6", "step 6, which is not a complete checkpoint"),  # tracker ahead of anything on disk
    ("3", "step 3, whose checkpoint is incomplete"),
    ("2", "a newer checkpoint was committed after it"),  # killed between rename and tracker write
])
def test_resume_falls_back_to_newest_complete_and_says_why(tracker, needle) -> None:
    listing = {"global_step_2": True, "global_step_3": False, "global_step_4": True, ".staging-global_step_5": False}
    point = choose_resume(listing, tracker)
    assert point is not None and point.step == 4 and point.name == "global_step_4"
    assert needle in point.note


def test_resume_never_picks_an_incomplete_folder_exhaustively() -> None:
    steps = [1, 2, 3, 4]
    for flags in itertools.product([False, True], repeat=len(steps)):
        listing = {step_dir_name(s): ok for s, ok in zip(steps, flags)}
        for tracker in [None, "junk"] + [str(s) for s in range(6)]:
            point = choose_resume(listing, tracker)
            complete = [s for s, ok in zip(steps, flags) if ok]
            if not complete:
                assert point is None
            else:
                assert point.step == max(complete) and listing[point.name]
                assert (point.note == "") == (tracker == str(max(complete)))


def test_prune_keeps_newest_complete_and_clears_leftovers() -> None:
    listing = {"global_step_2": True, "global_step_4": True, "global_step_6": True, "global_step_5": False,
               ".staging-global_step_8": False, ".trash-global_step_1.ab12": False, "notes": False}
    plan = plan_prune(listing, 2, protect=("global_step_6",))
    assert plan.delete == (".staging-global_step_8", ".trash-global_step_1.ab12", "global_step_2")
    assert set(plan.keep) == {"global_step_4", "global_step_6"}
    # an incomplete step folder is not ours (ours appear complete by rename): left alone; so is a foreign name
    assert "global_step_5" not in plan.delete and "notes" not in plan.delete


@pytest.mark.parametrize("keep", [None, 0, -1])
def test_prune_keep_all(keep) -> None:
    listing = {"global_step_2": True, "global_step_4": True}
    assert plan_prune(listing, keep).delete == ()


def test_prune_exhaustive_invariants() -> None:
    steps = [1, 2, 3, 4, 5]
    for flags in itertools.product([False, True], repeat=len(steps)):
        listing = {step_dir_name(s): ok for s, ok in zip(steps, flags)}
        complete = [s for s, ok in zip(steps, flags) if ok]
        for keep in range(0, 7):
            for protect in [(), (step_dir_name(steps[0]),)]:
                plan = plan_prune(listing, keep, protect)
                deleted = {parse_step_dir(n) for n in plan.delete}
                survivors = [s for s in complete if s not in deleted]
                assert all(listing[n] for n in plan.delete)  # only complete step folders are deleted
                assert not (set(protect) & set(plan.delete))
                if keep > 0:
                    assert sorted(complete)[-keep:] == [s for s in survivors if step_dir_name(s) not in protect
                                                        or s in sorted(complete)[-keep:]]
                else:
                    assert survivors == complete
