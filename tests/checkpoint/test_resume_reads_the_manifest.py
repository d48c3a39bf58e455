"""Resume reads only what checkpoint.json lists, and never a step folder saved under another checkpoint root
(issue 32 item 5; since issue 41 by the manifest's signature with the run's secret). Who may change the root
itself: tests/checkpoint/test_run_identity.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from reseal import reseal_unsigned
from test_safe_load import LAYOUT, committed_actor  # noqa: F401  (a committed step with one rank's files)
from verl_patches.checkpoint import commit, committed_role
from verl_patches.checkpoint.manifest import RankRecord, rank_record_name


def record_of(role: Path, rank: int) -> RankRecord:
    return RankRecord(rank=rank, layout=LAYOUT, tp_rank=0, pp_rank=0, ep_rank=0, dp_rank=0, files={}, sha256={})


@pytest.mark.parametrize("content", ["valid", "broken"])
def test_a_rank_record_added_after_the_commit_is_never_read(tmp_path: Path, content: str) -> None:
    role = committed_actor(tmp_path)
    extra = role / rank_record_name(7)
    extra.write_text(json.dumps(record_of(role, 7).to_json()) if content == "valid" else "{ not json")
    point, why = commit.find_resume_and_why(tmp_path)
    assert point is not None and point.name == "global_step_3" and why == ""  # the intact step is resumed
    assert commit.small_files_problem(tmp_path / "global_step_3") == ""
    layout, records = committed_role.saved_layout(committed_role.CommittedRole.open(role))
    assert [r.rank for r in records] == [0]


def test_a_listed_rank_record_changed_after_the_commit_is_refused_by_name(tmp_path: Path) -> None:
    role = committed_actor(tmp_path)
    rec = role / rank_record_name(0)
    doc = json.loads(rec.read_text())
    doc["dp_rank"] = 0
    rec.write_text(json.dumps(doc, indent=1))  # same meaning, other bytes: not the record that was committed
    from verl_patches.checkpoint.safe_load import UnsafeCheckpointError

    with pytest.raises(UnsafeCheckpointError, match=f"^{rec}: sha256"):
        committed_role.saved_layout(committed_role.CommittedRole.open(role))


def test_a_step_folder_copied_from_another_root_is_skipped_naming_it(tmp_path: Path) -> None:
    mine, other = tmp_path / "mine", tmp_path / "other"
    committed_actor(mine)  # step 3 of this root
    committed_actor(other)
    shutil.copytree(other / "global_step_3", mine / "global_step_9")
    reseal_unsigned(mine / "global_step_9", change=lambda man: man.update(step=9))
    point, why = commit.find_resume_and_why(mine)
    assert point is not None and point.name == "global_step_3"
    assert why.startswith(
        f"global_step_9 skipped: {mine / 'global_step_9' / 'checkpoint.json'}: its signature does not match the run "
        f"secret of {mine}: saved by another run or account and copied here"
    )
    assert "\n" not in why
    assert commit.prune(mine, keep_last=1) == []  # never deleted either: not ours
    assert (mine / "global_step_9").is_dir()


def test_a_root_whose_run_secret_is_gone_resumes_nothing_and_says_why(tmp_path: Path) -> None:
    committed_actor(tmp_path)
    (tmp_path / commit.SECRET_FILE).unlink()  # lost: nothing this root holds can be verified any more
    point, why = commit.find_resume_and_why(tmp_path)
    assert point is None and f"{tmp_path} has no run secret (.verl_patches_run_secret)" in why
    assert "global_step_3 skipped" in why and "\n" not in why
