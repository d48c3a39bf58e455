"""Pure planning: folder names, the checkpoint to resume from, what keep-last deletes."""

from __future__ import annotations

import itertools

import pytest

from verl_patches.checkpoint.plan import (
    Entry,
    ResumePoint,
    choose_resume,
    is_save_step,
    parse_step_dir,
    plan_prune,
    staging_dir_name,
    step_dir_name,
)

OK, BAD = Entry(complete=True, ours=True), Entry(problem="broken")


def entries(flags: dict[str, bool]) -> dict[str, Entry]:
    return {n: (OK if ok else BAD) for n, ok in flags.items()}


def test_names_round_trip_and_reject_other_folders() -> None:
    for step in (0, 1, 7, 1234567):
        assert parse_step_dir(step_dir_name(step)) == step
        assert parse_step_dir(staging_dir_name(step)) is None
    for name in (
        "global_step_",
        "global_step_-1",
        "global_step_1x",
        "xglobal_step_1",
        ".trash-global_step_3",
        "global_step_1/actor",
        "global_step_ 1",
        "global_step_1\n",
        "global_step_²",
        "global_step_007",
        "global_step_" + "9" * 13,
    ):
        assert parse_step_dir(name) is None, name
    for bad in (-1, 1.0, True, "3", 10**12):
        with pytest.raises(ValueError):
            step_dir_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("freq", [-1, 0, 1, 2, 3])
def test_is_save_step_matches_verl(freq: int) -> None:
    total = 7
    for step in range(1, total + 1):
        last = step == total
        assert is_save_step(step, freq, last) == (freq > 0 and (last or step % freq == 0))


def test_resume_prefers_tracker_when_it_is_the_newest_complete() -> None:
    listing = entries({"global_step_2": True, "global_step_4": True})
    assert choose_resume(listing, 4) == ResumePoint(4, "global_step_4", "")


def test_resume_from_scratch_when_nothing_is_complete() -> None:
    assert choose_resume({}, None) is None
    assert choose_resume(entries({"global_step_2": False, ".staging-global_step_4": False}), 2) is None


@pytest.mark.parametrize(
    "tracker,problem,needle",
    [
        (None, "", "no latest_checkpointed_iteration.txt"),
        (None, "t.txt: expected a step number", "t.txt: expected a step number; newest complete checkpoint used"),
        (6, "", "step 6, which is not a complete checkpoint"),  # tracker ahead of anything on disk
        (3, "", "step 3, whose checkpoint is incomplete"),
        (2, "", "a newer checkpoint was committed after it"),  # killed between rename and tracker write
    ],
)
def test_resume_falls_back_to_newest_complete_and_says_why(tracker, problem, needle) -> None:
    listing = entries(
        {"global_step_2": True, "global_step_3": False, "global_step_4": True, ".staging-global_step_5": False}
    )
    point = choose_resume(listing, tracker, problem)
    assert point is not None and point.step == 4 and point.name == "global_step_4"
    assert needle in point.note


def test_newer_corrupt_step_is_named_with_why() -> None:
    listing = {
        "global_step_2": OK,
        "global_step_4": OK,
        "global_step_5": Entry(problem="x/checkpoint.json: line 1: not valid JSON"),
        "global_step_6": Entry(problem="x: is a symbolic link"),
    }
    point = choose_resume(listing, 6)
    assert point.step == 4
    assert point.note == "global_step_6 skipped (and 1 more): x: is a symbolic link"
    point = choose_resume({"global_step_4": OK, "global_step_5": listing["global_step_5"]}, 4)
    assert point.note == "global_step_5 skipped: x/checkpoint.json: line 1: not valid JSON"
    assert "\n" not in point.note


def test_resume_never_picks_an_incomplete_folder_exhaustively() -> None:
    steps = [1, 2, 3, 4]
    for flags in itertools.product([False, True], repeat=len(steps)):
        listing = entries({step_dir_name(s): ok for s, ok in zip(steps, flags)})
        for tracker, problem in [(None, ""), (None, "junk")] + [(s, "") for s in range(6)]:
            point = choose_resume(listing, tracker, problem)
            complete = [s for s, ok in zip(steps, flags) if ok]
            if not complete:
                assert point is None
            else:
                assert point.step == max(complete) and listing[point.name].complete
                newer_broken = any(not ok and s > max(complete) for s, ok in zip(steps, flags))
                assert (point.note == "") == (tracker == max(complete) and not newer_broken)
                assert "\n" not in point.note


def test_prune_keeps_newest_complete_and_clears_leftovers() -> None:
    mine = Entry(ours=True)
    listing = {
        "global_step_2": OK,
        "global_step_4": OK,
        "global_step_6": OK,
        "global_step_5": Entry(ours=True),
        ".staging-global_step_8": mine,
        ".trash-n.ab12.global_step_1": mine,
        "notes": Entry(),
    }
    plan = plan_prune(listing, 2, protect=("global_step_6",))
    assert plan.delete == (".staging-global_step_8", ".trash-n.ab12.global_step_1", "global_step_2")
    assert set(plan.keep) == {"global_step_4", "global_step_6"}
    # an incomplete step folder is left alone (ours appear complete by rename); so is a foreign name
    assert "global_step_5" not in plan.delete and "notes" not in plan.delete


def test_prune_never_deletes_what_it_did_not_create() -> None:
    foreign = Entry()
    listing = {
        "global_step_1": Entry(complete=True, ours=False),
        "global_step_2": OK,
        "global_step_3": OK,
        ".staging-global_step_9": foreign,
        ".trash-other": foreign,
        ".staging-x": Entry(ours=True),
    }
    plan = plan_prune(listing, 1)
    assert plan.delete == (".staging-x", "global_step_2")
    # the foreign checkpoint neither counts towards keep-last nor is deleted
    assert plan_prune(listing, 2).delete == (".staging-x",)


@pytest.mark.parametrize("keep", [None, 0, -1])
def test_prune_keep_all(keep) -> None:
    listing = entries({"global_step_2": True, "global_step_4": True})
    assert plan_prune(listing, keep).delete == ()


def test_prune_exhaustive_invariants() -> None:
    steps = [1, 2, 3, 4, 5]
    for flags in itertools.product([False, True], repeat=len(steps)):
        listing = entries({step_dir_name(s): ok for s, ok in zip(steps, flags)})
        complete = [s for s, ok in zip(steps, flags) if ok]
        for keep in range(0, 7):
            for protect in [(), (step_dir_name(steps[0]),)]:
                plan = plan_prune(listing, keep, protect)
                deleted = {parse_step_dir(n) for n in plan.delete}
                survivors = [s for s in complete if s not in deleted]
                assert all(listing[n].complete and listing[n].ours for n in plan.delete)
                assert not (set(protect) & set(plan.delete))
                if keep > 0:
                    assert sorted(complete)[-keep:] == [
                        s for s in survivors if step_dir_name(s) not in protect or s in sorted(complete)[-keep:]
                    ]
                else:
                    assert survivors == complete
