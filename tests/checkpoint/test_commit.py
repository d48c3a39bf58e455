"""The filesystem side: staging + rename commit, tracker, keep-last pruning, resume lookup, interrupted saves."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from rank_files import LAYOUT, rng_file, write_rank_record
from verl_patches.checkpoint import commit
from verl_patches.checkpoint.manifest import CheckpointIncomplete, FileRecord, rank_record_name


def stage_rank_files(staging: Path, world: int = 2, skip_record: int | None = None) -> None:
    role = staging / "actor"
    for r in range(world):
        rng_file(role, r).write_bytes(b"x" * (10 + r))
        if r != skip_record:
            write_rank_record(role, r)
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
    assert man.step == 2 and man.roles["actor"] == LAYOUT
    assert man.files["actor/rng/rank_00001.pt"] == FileRecord(11, hashlib.sha256(b"x" * 11).hexdigest())
    assert man.files["data.pt"] == FileRecord(1, hashlib.sha256(b"d").hexdigest())  # hashed by the driver
    assert "checkpoint.json" not in man.files and commit.OWNER_FILE in man.files
    assert commit.is_complete(final)
    assert commit.find_resume(tmp_path).step == 2


def test_keep_last_prunes_older_checkpoints(tmp_path: Path) -> None:
    for step in (2, 4, 6, 8):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        commit.SECRET_FILE,
        "global_step_6",
        "global_step_8",
        "latest_checkpointed_iteration.txt",
    ]


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
    assert point.step == 2
    assert point.note == f"global_step_4 skipped: {final}/actor/rng/rank_00001.pt: 15 bytes, checkpoint.json records 11"
    (final / "checkpoint.json").write_text("{")
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and point.note.startswith(
        f"global_step_4 skipped: {final}/checkpoint.json: line 1: not valid"
    )


def test_resaving_a_step_replaces_it(tmp_path: Path) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 2)
    assert commit.is_complete(final) and not any(p.name.startswith(".trash-") for p in tmp_path.iterdir())


def test_rank_record_corrupt_is_named(tmp_path: Path) -> None:
    staging = commit.begin_step(tmp_path, 2)
    stage_rank_files(staging)
    (staging / "actor" / rank_record_name(1)).write_text("{}")
    with pytest.raises(CheckpointIncomplete, match="rank_00001.json: key 'files': expected a JSON object"):
        commit.commit_step(tmp_path, staging, 2)


def test_role_without_records_is_listed_by_files(tmp_path: Path) -> None:
    staging = commit.begin_step(tmp_path, 3)
    (staging / "actor").mkdir()
    (staging / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"fsdp")
    final = commit.commit_step(tmp_path, staging, 3)
    man = commit.read_manifest(final)
    assert man.roles == {"actor": None}
    assert man.files["actor/model_world_size_1_rank_0.pt"] == FileRecord(4, hashlib.sha256(b"fsdp").hexdigest())


def test_empty_root_resumes_nothing(tmp_path: Path) -> None:
    assert commit.find_resume(tmp_path / "nope") is None
    assert commit.listing(tmp_path / "nope") == {}


# --- hostile and broken roots (issue #27): prune deletes only what it created, links are never followed --------


def test_prune_leaves_foreign_staging_trash_and_checkpoints_alone(tmp_path: Path) -> None:
    save(tmp_path, 1)
    foreign = {
        ".staging-global_step_9": "another tool's save",
        ".trash-photos": "someone's trash",
        f".trash-{'0' * 16}.abcd1234.x": "a trash name with another root's tag",
    }
    for name, text in foreign.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text(text)
    # a complete checkpoint copied in from another run: not ours to delete (nor to resume: another secret)
    other = tmp_path / "other_root"
    save(other, 2)
    os.rename(other / "global_step_2", tmp_path / "global_step_2")
    for step in (3, 4, 5):
        save(tmp_path, step, keep=1)
    names = sorted(p.name for p in tmp_path.iterdir())
    for name in foreign:
        assert (tmp_path / name / "keep.txt").read_text() == foreign[name]
    assert "global_step_2" in names and "global_step_5" in names
    assert not {"global_step_1", "global_step_3", "global_step_4"} & set(names)


def test_prune_finishes_our_interrupted_deletes_and_staging(tmp_path: Path) -> None:
    save(tmp_path, 1)
    tags = commit.root_tags(tmp_path, create=False)
    half_deleted = tmp_path / f".trash-{tags.trash}.deadbeef.global_step_0"
    half_deleted.mkdir()
    (half_deleted / "junk").write_bytes(b"x")
    interrupted = commit.begin_step(tmp_path, 7)  # a save that died before its commit
    save(tmp_path, 2)
    assert not half_deleted.exists() and not interrupted.exists()


def test_links_are_never_renamed_followed_or_deleted(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("mine")
    root = tmp_path / "root"
    save(root, 1)
    tags = commit.root_tags(root, create=False)
    links = [".staging-global_step_5", f".trash-{tags.trash}.00000000.global_step_0", "global_step_0"]
    for name in links:
        os.symlink(outside, root / name)
    for step in (2, 3, 4):
        save(root, step, keep=1)
    assert sorted(p.name for p in root.iterdir() if p.is_symlink()) == sorted(links)  # never renamed, even once
    assert (outside / "precious").read_text() == "mine"


def test_symlinked_step_folder_is_not_resumed_and_the_note_says_why(tmp_path: Path) -> None:
    save(tmp_path, 2)
    elsewhere = save(tmp_path / "elsewhere", 9)
    os.symlink(elsewhere, tmp_path / "global_step_9")
    point = commit.find_resume(tmp_path)
    assert point.step == 2
    assert point.note.startswith(f"global_step_9 skipped: {tmp_path / 'global_step_9'}: is a symbolic link")
    with pytest.raises(CheckpointIncomplete, match="is a symbolic link"):
        commit.read_manifest(tmp_path / "global_step_9")


def test_a_link_inside_a_step_folder_makes_it_incomplete(tmp_path: Path) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 4)
    outside = tmp_path.parent / f"{tmp_path.name}_outside"
    outside.mkdir()
    os.rename(final / "actor" / "rng", outside / "rng")
    os.symlink(outside / "rng", final / "actor" / "rng")  # same sizes, reached through a link
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and "is a symbolic link" in point.note


@pytest.mark.parametrize("name", ["../outside.pt", "/etc/hostname", "actor/../../outside.pt"])
def test_manifest_names_outside_the_step_folder_make_it_incomplete(tmp_path: Path, name: str) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 4)
    (tmp_path / "outside.pt").write_bytes(b"z")
    man = json.loads((final / "checkpoint.json").read_text())
    man["files"] = {name: {"bytes": 1, "sha256": "0" * 64}}  # would be "complete" if the name were followed
    (final / "checkpoint.json").write_text(json.dumps(man))
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and "global_step_4 skipped" in point.note


@pytest.mark.parametrize(
    "content,needle",
    [
        ("²".encode(), "expected a step number"),
        (b"9" * 5000, "5000 bytes"),
        (b"\xff\xfe4", "not UTF-8"),
        (b"4\n4\n", "more than one line"),
        (b"-4", "expected a step number"),
    ],
)
def test_broken_tracker_falls_back_and_says_why(tmp_path: Path, content: bytes, needle: str) -> None:
    save(tmp_path, 2)
    save(tmp_path, 4)
    (tmp_path / "latest_checkpointed_iteration.txt").write_bytes(content)
    point = commit.find_resume(tmp_path)
    assert point.step == 4 and needle in point.note and "\n" not in point.note
    assert point.note.startswith(str(tmp_path / "latest_checkpointed_iteration.txt"))


def test_symlinked_tracker_is_not_read(tmp_path: Path) -> None:
    save(tmp_path, 2)
    secret = tmp_path.parent / f"{tmp_path.name}_secret.txt"
    secret.write_text("hunter2")
    (tmp_path / "latest_checkpointed_iteration.txt").unlink()
    os.symlink(secret, tmp_path / "latest_checkpointed_iteration.txt")
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and "symbolic link" in point.note and "hunter2" not in point.note


def test_saving_over_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 1)
    (tmp_path / ".staging-global_step_3").mkdir()
    with pytest.raises(commit.CheckpointRootError, match=r"\.staging-global_step_3: exists and was not created"):
        commit.begin_step(tmp_path, 3)
    other = save(tmp_path / "other", 4)
    os.rename(other, tmp_path / "global_step_4")
    before = (tmp_path / "global_step_4" / "checkpoint.json").read_bytes()
    staging = commit.begin_step(tmp_path, 4)
    stage_rank_files(staging)
    with pytest.raises(commit.CheckpointRootError, match="global_step_4: exists and was not saved by this"):
        commit.commit_step(tmp_path, staging, 4)
    assert (tmp_path / "global_step_4" / "checkpoint.json").read_bytes() == before  # untouched
    assert "signature does not match the run secret" in commit.step_problem(tmp_path / "global_step_4")


@pytest.mark.parametrize("rel,content", [("actor/rng/rank_00001.pt", b"y" * 11), ("actor/ranks/rank_00000.json", None)])
def test_same_size_change_of_a_small_file_skips_the_step_and_names_it(tmp_path: Path, rel: str, content) -> None:
    save(tmp_path, 2)
    final = save(tmp_path, 4)
    path = final / rel
    size = path.stat().st_size
    path.write_bytes(content if content is not None else b" " * size)  # a record blanked: same size, not JSON
    assert commit.is_complete(final)  # by sizes
    point = commit.find_resume(tmp_path)
    assert point.step == 2 and point.note.startswith(f"global_step_4 skipped: {path}: sha256 ")
