"""The filesystem side: staging + rename commit, tracker, keep-last pruning, resume lookup, interrupted saves."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from verl_patches.checkpoint import commit
from verl_patches.checkpoint.manifest import CheckpointIncomplete, RankRecord, TrainLayout, rank_record_name

LAYOUT = TrainLayout(tp=1, pp=1, ep=2, dp=2)


def stage_rank_files(staging: Path, world: int = 2, skip_record: int | None = None) -> None:
    role = staging / "actor"
    for r in range(world):
        f = role / f"rng/rank_{r:05d}.pt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * (10 + r))
        if r != skip_record:
            rec = RankRecord(rank=r, layout=LAYOUT, tp_rank=0, pp_rank=0, ep_rank=r, dp_rank=r,
                             files={f"rng/rank_{r:05d}.pt": 10 + r})
            (role / rank_record_name(r)).parent.mkdir(parents=True, exist_ok=True)
            (role / rank_record_name(r)).write_text(json.dumps(rec.to_json()))
    (staging / "data.pt").write_bytes(b"d")


def save(root: Path, step: int, keep: int | None = None) -> Path:
    staging = commit.begin_step(root, step)
    stage_rank_files(staging)
    final = commit.commit_step(root, staging, step)
    commit.prune(root, keep, protect=(final.name,))
    return final


def test_commit_writes_manifest_renames_and_tracks(tmp_path: Path) -> None:
    final = save(tmp_path, 2)
    assert final == tmp_path / "global_step_2" and final.is_dir()
    assert not (tmp_path / ".staging-global_step_2").exists()
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    man = commit.read_manifest(final)
    assert man["step"] == 2 and TrainLayout.from_json(man["roles"]["actor"]) == LAYOUT
    assert man["files"]["actor/rng/rank_00001.pt"] == 11 and "checkpoint.json" not in man["files"]
    assert commit.is_complete(final)
    assert commit.find_resume(tmp_path).step == 2


def test_keep_last_prunes_older_checkpoints(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_6", "global_step_8"]


def test_crash_while_saving_leaves_previous_checkpoint_valid(tmp_path: Path) -> None:
    save(tmp_path, 2)
    staging = commit.begin_step(tmp_path, 4)
    stage_rank_files(staging, skip_record=1)  # rank 1 died before writing its record
    with pytest.raises(CheckpointIncomplete, match=r"actor: rank records \[0\].*missing \[1\]"):
        commit.commit_step(tmp_path, staging, 4)
    assert not (tmp_path / "global_step_4").exists()
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and point.note == ""
    # the next save of any step clears the leftover
    save(tmp_path, 6)
    assert not staging.exists()


def test_missing_file_blocks_the_commit(tmp_path: Path) -> None:
    staging = commit.begin_step(tmp_path, 4)
    stage_rank_files(staging)
    (staging / "actor/rng/rank_00000.pt").unlink()
    with pytest.raises(CheckpointIncomplete, match="rank 0: rng/rank_00000.pt is missing"):
        commit.commit_step(tmp_path, staging, 4)


def test_kill_between_rename_and_tracker_resumes_from_the_newer(tmp_path: Path) -> None:
    save(tmp_path, 2)
    save(tmp_path, 4)
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")  # the tracker write never happened
    point = commit.find_resume(tmp_path)
    assert point.step == 4 and "newer checkpoint was committed" in point.note


def test_damaged_checkpoint_is_skipped(tmp_path: Path) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 4)
    with open(final / "actor/rng/rank_00001.pt", "ab") as f:
        f.write(b"more")
    assert not commit.is_complete(final)
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and "incomplete" in point.note
    (final / "checkpoint.json").write_text("{")
    assert commit.find_resume(tmp_path).step == 2


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 2)
    assert commit.is_complete(final) and not any(p.name.startswith(".trash-") for p in tmp_path.iterdir())


def test_rank_record_corrupt_is_named(tmp_path: Path) -> None:
    staging = commit.begin_step(tmp_path, 2)
    stage_rank_files(staging)
    (staging / "actor" / rank_record_name(1)).write_text("{}")
    with pytest.raises(CheckpointIncomplete, match="rank_00001.json: unreadable rank record"):
        commit.commit_step(tmp_path, staging, 2)


def test_role_without_records_is_listed_by_files(tmp_path: Path) -> None:
    staging = commit.begin_step(tmp_path, 3)
    (staging / "actor").mkdir()
    (staging / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"fsdp")
    final = commit.commit_step(tmp_path, staging, 3)
    man = commit.read_manifest(final)
    assert man["roles"] == {"actor": None} and man["files"] == {"actor/model_world_size_1_rank_0.pt": 4}


def test_empty_root_resumes_nothing(tmp_path: Path) -> None:
    assert commit.find_resume(tmp_path / "nope") is None
    assert commit.listing(tmp_path / "nope") == {}
