"""The driver's side of a save written in the background (issue 42), with a worker group that writes what the
Megatron workers write (a file and a record per rank) in a background thread of this process.

The step is committed (manifest, rename, tracker) only once every rank's write is fenced; until then the
previous committed step is the one a resume takes, the tracker does not move, and a write that fails leaves
both as they were. Saves stay in the foreground unless the key is on, the fit loop fences before updates,
and the actor is the Megatron worker without a critic.
"""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rank_files import rng_file, write_rank_record
from verl_patches.checkpoint import background_write, commit, trainer_io
from verl_patches.checkpoint.background_write import BackgroundWrite, BackgroundWriteError
from verl_patches.driver import checkpoint_fence
from verl_patches.patches.verl.utils.checkpoint.trainer import _save_checkpoint


@pytest.fixture(autouse=True)
def _no_pending_write():
    yield
    try:
        background_write.fence_pending()
    except BackgroundWriteError:
        pass


def write_rank_files(role: Path, step: int, ranks: tuple[int, ...], pause_s: float = 0.0, fail: bool = False):
    for r in ranks:
        f = rng_file(role, r)
        time.sleep(pause_s)
        torch.save({"step": step, "rank": r}, f)
        if fail:
            raise OSError(5, "Input/output error")
        write_rank_record(role, r)
    return "record"


class BackgroundWorkerGroup:
    """Both ranks' writes in one background thread of this process (`background_write`'s one pending write)."""

    def __init__(self, pause_s: float = 0.3, fail_step: int | None = None) -> None:
        self.pause_s, self.fail_step = pause_s, fail_step
        self.calls: list[dict] = []

    def save_checkpoint(self, path: str, hdfs: None, step: int, max_ckpt_to_keep=None, background=False) -> None:
        self.calls.append({"step": step, "background": background})
        role = Path(path)
        if not background:
            write_rank_files(role, step, (0, 1))
            return
        fail = step == self.fail_step
        background_write.start(
            BackgroundWrite(step, 0, lambda report: write_rank_files(role, step, (0, 1), self.pause_s, fail))
        )


class FakeLoader:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}


def trainer(root: Path, group=None, *, on=True, strategy="megatron", fenced=True, critic=False, keep=2):
    cfg = OmegaConf.create(
        {
            "overlay": {"async_checkpoint": on},
            "actor_rollout_ref": {"actor": {"strategy": strategy}},
            "trainer": {
                "default_local_dir": str(root),
                "default_hdfs_dir": None,
                "resume_mode": "auto",
                "resume_from_path": None,
                "max_actor_ckpt_to_keep": keep,
            },
        }
    )
    t = SimpleNamespace(
        config=cfg,
        actor_rollout_wg=group or BackgroundWorkerGroup(),
        train_dataloader=FakeLoader(),
        global_steps=0,
        total_training_steps=10,
        use_critic=critic,
    )
    if fenced:
        trainer_io.fence_before_updates(t)
    return t


def tracker(root: Path) -> str:
    return (root / "latest_checkpointed_iteration.txt").read_text()


def test_the_step_commits_only_after_every_write_is_fenced(tmp_path: Path, capsys) -> None:
    t = trainer(tmp_path)
    t.global_steps = 2
    _save_checkpoint(t)
    checkpoint_fence.finish_pending_save(t)
    assert tracker(tmp_path) == "2"

    t.global_steps, t.train_dataloader.position = 4, 12
    t0 = time.monotonic()
    assert trainer_io.save_step(t) is None  # back at once: the files are being written
    assert time.monotonic() - t0 < 0.5 and t.actor_rollout_wg.calls[-1] == {"step": 4, "background": True}
    pending = trainer_io.pending_save(t)
    assert pending is not None and pending.step == 4 and pending.staging.name == ".staging-global_step_4"
    # until the fence: no step 4, the tracker and a resume still say step 2
    assert not (tmp_path / "global_step_4").exists() and tracker(tmp_path) == "2"
    assert commit.find_resume(tmp_path).step == 2
    assert "step 4: snapshot taken in" in capsys.readouterr().out

    metrics = checkpoint_fence.finish_pending_save(t)
    assert trainer_io.pending_save(t) is None
    assert tracker(tmp_path) == "4" and commit.find_resume(tmp_path).step == 4
    assert commit.read_manifest(tmp_path / "global_step_4").files["data.pt"].size > 0
    assert metrics["checkpoint/committed_step"] == 4.0 and metrics["checkpoint/write_s"] >= 0.5
    assert metrics["checkpoint/fence_wait_s"] > 0 and metrics["checkpoint/snapshot_s"] < 0.5
    out = capsys.readouterr().out
    assert f"step 4 saved to {tmp_path / 'global_step_4'} in the background:" in out
    assert checkpoint_fence.finish_pending_save(t) == {}  # nothing pending any more


def test_a_failed_write_leaves_the_previous_commit_and_the_tracker(tmp_path: Path) -> None:
    t = trainer(tmp_path, BackgroundWorkerGroup(pause_s=0.1, fail_step=4))
    t.global_steps = 2
    _save_checkpoint(t)
    checkpoint_fence.finish_pending_save(t)
    t.global_steps = 4
    _save_checkpoint(t)
    with pytest.raises(BackgroundWriteError, match="checkpoint step 4: rank 0's background write failed: OSError"):
        checkpoint_fence.finish_pending_save(t)
    assert trainer_io.pending_save(t) is None
    assert tracker(tmp_path) == "2" and commit.find_resume(tmp_path).step == 2
    assert not (tmp_path / "global_step_4").exists()
    assert (tmp_path / ".staging-global_step_4").is_dir()  # a leftover: the next commit's prune removes it
    t.global_steps = 6
    _save_checkpoint(t)
    checkpoint_fence.finish_pending_save(t)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_2", "global_step_6"]


def test_a_save_commits_the_previous_background_save_first(tmp_path: Path) -> None:
    t = trainer(tmp_path, keep=3)
    for step in (2, 4):
        t.global_steps = step
        _save_checkpoint(t)  # step 4's save fences and commits step 2 before it starts
    assert tracker(tmp_path) == "2" and trainer_io.pending_save(t).step == 4
    checkpoint_fence.finish_pending_save(t)
    assert tracker(tmp_path) == "4"


def test_saving_again_before_the_fence_is_refused_by_the_driver_io(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    t.global_steps = 2
    trainer_io.save_step(t)
    t.global_steps = 4
    with pytest.raises(RuntimeError, match="step 2's background save was never fenced and committed"):
        trainer_io.save_step(t)


@pytest.mark.parametrize(
    "kwargs",
    [dict(on=False), dict(fenced=False), dict(strategy="fsdp"), dict(critic=True)],
    ids=["key off", "a fit loop that does not fence", "verl's FSDP worker", "with a critic"],
)
def test_saves_stay_in_the_foreground_unless_everything_allows_the_background(tmp_path: Path, kwargs) -> None:
    t = trainer(tmp_path, **kwargs)
    assert not trainer_io.background_saves(t)
    if kwargs.get("critic"):
        return
    t.global_steps = 2
    assert trainer_io.save_step(t) == tmp_path / "global_step_2"
    assert t.actor_rollout_wg.calls == [{"step": 2, "background": False}] and tracker(tmp_path) == "2"


def test_the_background_is_used_when_everything_allows_it(tmp_path: Path) -> None:
    assert trainer_io.background_saves(trainer(tmp_path))
