"""verl_patches/trainer/checkpoint_folder.py: the roots a run saves into or resumes from, judged before anything
starts by the rule the save and the resume apply (checkpoint.root_access)."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_patches.checkpoint.root_access import ALLOW_SHARED_ROOT_ENV
from verl_patches.trainer.checkpoint_folder import root_problem, roots_used

A3 = {"device": "npu", "profile": "a3_256die_true_weight"}
TINY = {"device": "cpu", "profile": "tiny"}


def cfg(root: Path | str | None, *, run=A3, save_freq=10, mode="auto", resume_from=None):
    return OmegaConf.create(
        {
            "trainer": {
                "device": run["device"],
                "default_local_dir": None if root is None else str(root),
                "save_freq": save_freq,
                "resume_mode": mode,
                "resume_from_path": resume_from,
            },
            "overlay": {"profile": run["profile"]},
        }
    )


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    root = tmp_path / "ck"
    root.mkdir()
    root.chmod(0o770)  # a group member can replace a step
    return root


@pytest.mark.parametrize(
    "save_freq,mode,expected",
    [(10, "auto", ["ck"]), (-1, "auto", ["ck"]), (10, "disable", ["ck"]), (-1, "disable", []), (0, "disable", [])],
)
def test_the_save_root_is_judged_when_the_run_saves_or_resumes_from_it(tmp_path, save_freq, mode, expected):
    roots = roots_used(cfg(tmp_path / "ck", save_freq=save_freq, mode=mode))
    assert [r.name for r in roots] == expected


def test_a_named_step_is_judged_by_the_folder_that_holds_it(tmp_path):
    step = tmp_path / "other" / "global_step_20"
    roots = roots_used(cfg(tmp_path / "ck", save_freq=-1, mode="resume_path", resume_from=str(step)))
    assert roots == [tmp_path / "other"]


def test_a_relative_root_is_where_the_trainer_resolves_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert roots_used(cfg("checkpoints/run")) == [tmp_path / "checkpoints" / "run"]


def test_a_shared_root_is_refused_on_the_cluster_in_one_line(shared, monkeypatch):
    monkeypatch.delenv(ALLOW_SHARED_ROOT_ENV, raising=False)
    problem = root_problem(cfg(shared))
    assert problem is not None and "\n" not in problem
    assert (
        problem.startswith(f"{shared}: others can change what is saved there") and "refused on the cluster" in problem
    )
    named = root_problem(
        cfg(shared.parent / "mine", save_freq=-1, mode="resume_path", resume_from=f"{shared}/global_step_3")
    )
    assert named is not None and named.startswith(f"{shared}: others can change")


def test_a_shared_root_is_a_warning_off_the_cluster_or_when_accepted_by_name(shared, capsys):
    assert root_problem(cfg(shared, run=TINY), environ={}) is None
    assert "refused on a cluster profile unless" in capsys.readouterr().out
    assert root_problem(cfg(shared), environ={ALLOW_SHARED_ROOT_ENV: "1"}) is None
    problem = root_problem(cfg(shared), environ={ALLOW_SHARED_ROOT_ENV: "yes please"})
    assert problem is not None and ALLOW_SHARED_ROOT_ENV in problem


def test_a_root_of_ours_alone_or_not_there_yet_passes(tmp_path):
    tmp_path.chmod(0o700)
    (tmp_path / "ck").mkdir(mode=0o700)
    assert root_problem(cfg(tmp_path / "ck"), environ={}) is None
    assert root_problem(cfg(tmp_path / "new"), environ={}) is None  # the first save creates it
    assert root_problem(cfg(None), environ={}) is None  # folder_problem's to name
