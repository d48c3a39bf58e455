"""``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``: atomic step checkpoints and resume
(`verl_patches.checkpoint.trainer_io`); a save first commits the one before it if that one's files were still
being written in the background (`verl_patches.driver.checkpoint_fence.finish_pending_save`)."""

from __future__ import annotations

from typing import Any

from verl_patches.checkpoint.trainer_io import load_latest, save_step
from verl_patches.driver.checkpoint_fence import finish_pending_save


def _save_checkpoint(self: Any) -> None:
    finish_pending_save(self)
    save_step(self)


def _load_checkpoint(self: Any) -> int:
    return load_latest(self)
