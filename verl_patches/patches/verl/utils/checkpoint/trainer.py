"""``RayPPOTrainer._save_checkpoint`` / ``_load_checkpoint``: atomic step checkpoints and resume
(`verl_patches.checkpoint.trainer_io`)."""

from __future__ import annotations

from typing import Any


def _save_checkpoint(self: Any) -> None:
    from verl_patches.checkpoint.trainer_io import save_step

    save_step(self)


def _load_checkpoint(self: Any) -> int:
    from verl_patches.checkpoint.trainer_io import load_latest

    return load_latest(self)
