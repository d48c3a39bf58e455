"""The driver's save and resume (the declared replacements of RayPPOTrainer._save/_load_checkpoint), with
worker groups that write what the Megatron workers write (rank records and files) in this process."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from rank_files import rng_file, write_rank_record
from verl_patches.checkpoint import commit, trainer_io
from verl_patches.checkpoint.manifest import CheckpointIncomplete
from verl_patches.checkpoint.safe_load import UnsafeCheckpointError, load_tensor_file


class FakeWorkerGroup:
    """Two ranks; save writes a file and a record per rank, load records the path."""

    def __init__(self, fail_rank: int | None = None) -> None:
        self.fail_rank = fail_rank
        self.loaded: list[str] = []

    def save_checkpoint(self, path: str, hdfs: None, step: int, max_ckpt_to_keep=None) -> None:
        role = Path(path)
        for r in range(2):
            torch.save({"step": step, "rank": r}, rng_file(role, r))
            if r == self.fail_rank:
                continue  # this rank died before its record
            write_rank_record(role, r)

    def load_checkpoint(self, path: str, del_local_after_load: bool = False) -> None:
        assert del_local_after_load is False
        self.loaded.append(path)


class FakeLoader:
    def __init__(self) -> None:
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def trainer(root: Path, **trainer_cfg) -> SimpleNamespace:
    cfg = OmegaConf.create(
        {
            "trainer": {
                "default_local_dir": str(root),
                "default_hdfs_dir": None,
                "resume_mode": "auto",
                "resume_from_path": None,
                "max_actor_ckpt_to_keep": None,
                **trainer_cfg,
            }
        }
    )
    return SimpleNamespace(
        config=cfg,
        actor_rollout_wg=FakeWorkerGroup(),
        train_dataloader=FakeLoader(),
        global_steps=0,
        total_training_steps=10,
        use_critic=False,
    )


def test_save_then_resume_restores_step_and_dataloader(tmp_path: Path, capsys) -> None:
    t = trainer(tmp_path, max_actor_ckpt_to_keep=2)
    for step in (2, 4, 6):
        t.global_steps, t.train_dataloader.position = step, step * 3
        trainer_io.save_step(t)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_4", "global_step_6"]
    assert "step 6 saved to" in capsys.readouterr().out

    fresh = trainer(tmp_path)
    assert trainer_io.load_latest(fresh) == 6
    assert fresh.global_steps == 6 and fresh.train_dataloader.position == 18
    assert fresh.actor_rollout_wg.loaded == [str(tmp_path / "global_step_6" / "actor")]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("verl_patches resume:")]
    assert lines == [
        f"verl_patches resume: from {tmp_path / 'global_step_6'} (step 6; actor TP1xPP1xEP2 DP2; "
        "model, optimizer, RNG and dataloader restored)"
    ]


def test_crash_while_saving_keeps_previous(tmp_path: Path, capsys) -> None:
    t = trainer(tmp_path)
    t.global_steps = 2
    trainer_io.save_step(t)
    t.global_steps, t.actor_rollout_wg = 4, FakeWorkerGroup(fail_rank=1)
    with pytest.raises(CheckpointIncomplete, match="missing \\[1\\]"):
        trainer_io.save_step(t)
    fresh = trainer(tmp_path)
    assert trainer_io.load_latest(fresh) == 2


def test_from_scratch_and_disable_say_so(tmp_path: Path, capsys) -> None:
    assert trainer_io.load_latest(trainer(tmp_path / "none")) == 0
    assert f"starting from step 0 (no complete checkpoint under {tmp_path / 'none'})" in capsys.readouterr().out
    t = trainer(tmp_path)
    t.global_steps = 2
    trainer_io.save_step(t)
    assert trainer_io.load_latest(trainer(tmp_path, resume_mode="disable")) == 0
    assert "resume_mode=disable" in capsys.readouterr().out


def test_resume_path(tmp_path: Path) -> None:
    t = trainer(tmp_path)
    for step in (2, 4):
        t.global_steps = step
        trainer_io.save_step(t)
    fresh = trainer(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_2"))
    assert trainer_io.load_latest(fresh) == 2
    with pytest.raises(ValueError, match="must name a global_step_N folder"):
        trainer_io.load_latest(trainer(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path)))
    with pytest.raises(CheckpointIncomplete, match="global_step_9/checkpoint.json: missing"):
        trainer_io.load_latest(
            trainer(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_9"))
        )
    with pytest.raises(ValueError, match="resume_mode='sometimes'"):
        trainer_io.load_latest(trainer(tmp_path, resume_mode="sometimes"))


def test_resume_path_refuses_a_link_and_a_damaged_step(tmp_path: Path) -> None:
    t = trainer(tmp_path / "ck")
    t.global_steps = 2
    step = trainer_io.save_step(t)
    os.symlink(step, tmp_path / "global_step_2")
    with pytest.raises(CheckpointIncomplete, match="global_step_2: is a symbolic link"):
        trainer_io.load_latest(
            trainer(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_2"))
        )
    (step / "data.pt").write_bytes(b"short")
    with pytest.raises(CheckpointIncomplete, match=r"resume_from_path=.*data.pt: 5 bytes, checkpoint.json records"):
        trainer_io.load_latest(trainer(tmp_path / "ck", resume_mode="resume_path", resume_from_path=str(step)))


def test_tampered_dataloader_state_is_refused_before_any_worker_loads(tmp_path: Path, capsys) -> None:
    t = trainer(tmp_path)
    for step in (2, 4):
        t.global_steps = step
        trainer_io.save_step(t)
    data = tmp_path / "global_step_4" / "data.pt"
    data.write_bytes(b"\0" * data.stat().st_size)  # same size: complete by sizes, refused by digest
    fresh = trainer(tmp_path)
    assert trainer_io.load_latest(fresh) == 2  # auto: the damaged newest step is skipped, and the line says why
    out = capsys.readouterr().out
    assert f"global_step_4 skipped: {data}: sha256 " in out and "differs" in out
    assert fresh.actor_rollout_wg.loaded == [str(tmp_path / "global_step_2" / "actor")]
    # named explicitly: refused, before any worker loads
    fresh = trainer(tmp_path, resume_mode="resume_path", resume_from_path=str(tmp_path / "global_step_4"))
    with pytest.raises(CheckpointIncomplete, match=f"{data}: sha256 .* differs"):
        trainer_io.load_latest(fresh)
    assert fresh.actor_rollout_wg.loaded == []
    # the digest is checked again where the file is read (a change after the choice is refused too)
    with pytest.raises(UnsafeCheckpointError, match=f"{data}: sha256 .* differs"):
        load_tensor_file(data, expected_sha256=commit.read_manifest(data.parent).files["data.pt"].sha256)


def test_only_checkpoint_damaged_starts_from_scratch_and_says_why(tmp_path: Path, capsys) -> None:
    t = trainer(tmp_path)
    t.global_steps = 2
    trainer_io.save_step(t)
    (tmp_path / "global_step_2" / "checkpoint.json").write_bytes(b"\xff")
    assert trainer_io.load_latest(trainer(tmp_path)) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("verl_patches resume:")]
    assert line == [
        f"verl_patches resume: starting from step 0 (no complete checkpoint under {tmp_path}; "
        f"global_step_2 skipped: {tmp_path / 'global_step_2' / 'checkpoint.json'}: not UTF-8 (byte 0))"
    ]


def test_hdfs_is_refused(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="default_hdfs_dir"):
        trainer_io.load_latest(trainer(tmp_path, default_hdfs_dir="hdfs://x"))


def test_remove_previous_ckpt_in_save_keeps_one(tmp_path: Path) -> None:
    t = trainer(tmp_path, remove_previous_ckpt_in_save=True)
    for step in (1, 2, 3):
        t.global_steps = step
        trainer_io.save_step(t)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["global_step_3"]


def test_declared_patches_point_at_these_functions() -> None:
    from verl_patches.patches.verl.utils.checkpoint.declarations import PATCHES

    targets = {p.target.split(":")[1] for p in PATCHES}
    assert targets == {
        "MegatronCheckpointManager.save_checkpoint",
        "MegatronCheckpointManager.load_checkpoint",
        "FSDPCheckpointManager.load_checkpoint",
        "RayPPOTrainer._save_checkpoint",
        "RayPPOTrainer._load_checkpoint",
        "ActorRolloutRefWorker.save_checkpoint",
        "ActorRolloutRefWorker.update_actor",  # the fence before an update (background saves)
    }
    for p in PATCHES:
        made = p.replacement(lambda *a: None) if p.kind.value == "wrap" else p.replacement()
        assert callable(made)
