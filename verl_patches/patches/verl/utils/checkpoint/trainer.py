"""``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``: atomic step checkpoints and resume
(`verl_patches.checkpoint.trainer_io`)."""

from __future__ import annotations

from typing import Any

from verl_patches.checkpoint.trainer_io import load_latest, save_step


def _save_checkpoint(self: Any) -> None:
    save_step(self)


def _load_checkpoint(self: Any) -> int:
    return load_latest(self)
