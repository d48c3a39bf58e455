"""What checkpointing and validation cost on A3, from the model config and the vendor's step table.

The cadences of the A3 profiles (``trainer.save_freq``, ``trainer.test_freq``) are judged against these
figures, and the dry run prints them, so the numbers live in one place:

* one checkpoint step: every parameter of the actor as bf16 weights (2 bytes) plus the distributed optimizer's
  fp32 master weights and Adam moments (4 + 4 + 4 bytes), counted from the HF ``config.json`` with the memory
  model's parameter count (`memory_estimate.total_params`); the reference model, the RNG states and the
  dataloader position are not counted (the reference is not saved, the rest is kilobytes);
* the room a checkpoint folder needs: the steps kept (``trainer.max_actor_ckpt_to_keep``) plus the one being
  written, because a save commits before it prunes the oldest (`checkpoint.commit.prune`);
* the vendor's step timings (reference §2, "Step breakdown"), marked as the vendor's.

Pure arithmetic: nothing here reads a file or the clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from verl_patches.launch.memory_estimate import ADAM_BYTES_PER_PARAM, BF16, ModelShape, total_params

CHECKPOINT_BYTES_PER_PARAM = BF16 + ADAM_BYTES_PER_PARAM  # bf16 weights 2 + fp32 master 4 + Adam m 4 + v 4
CHECKPOINT_BYTES_NOTE = (
    f"{CHECKPOINT_BYTES_PER_PARAM} bytes: bf16 weights 2 + fp32 master weights 4 + Adam moments 4 + 4"
)
VENDOR_SOURCE = "the vendor's step table, reference §2"


@dataclass(frozen=True)
class CheckpointStep:
    """The size of one saved step of the actor."""

    params: int

    @property
    def nbytes(self) -> int:
        return self.params * CHECKPOINT_BYTES_PER_PARAM


def checkpoint_step(model: Mapping[str, Any]) -> CheckpointStep:
    """One checkpoint step of the model a HF ``config.json`` dict describes (671.0 B parameters, 9.39 TB for
    DeepSeek-V3 without MTP)."""
    return CheckpointStep(total_params(ModelShape.from_hf_config(model)))


def saves_in_run(save_freq: int, total_steps: int | None) -> int | None:
    """Steps a run of ``total_steps`` saves (verl: every ``save_freq`` steps and the last); None when the run's
    length is not in the config (it follows from the data)."""
    if save_freq <= 0:
        return 0
    if total_steps is None or total_steps <= 0:
        return None
    return total_steps // save_freq + (1 if total_steps % save_freq else 0)


def room_needed(step_bytes: int, keep: int | None, existing_steps: int, saves: int | None = None) -> int:
    """Free bytes the next saves need: ``keep`` steps plus the one being written, less the steps already there,
    and never more steps than the run saves (``saves``, when known).

    ``keep`` None or <= 0 means every step is kept (verl's default): then each save needs one more step of
    room and the folder fills up; that is reported by the caller, and one step is what is needed now."""
    steps = 1 if not keep or keep <= 0 else max(0, keep + 1 - min(max(existing_steps, 0), keep))
    if saves is not None:
        steps = min(steps, saves)
    return steps * step_bytes


@dataclass(frozen=True)
class VendorStep:
    """One step of the vendor's run as its step table gives it (seconds)."""

    step_s: float
    rollout_s: float  # generation, without the train -> rollout weight switch
    switch_s: float  # the weight switch (reshard + offload)
    what: str

    @property
    def validation_s(self) -> float:
        """A validation is one more generate (of fewer prompts than a training rollout, one response each,
        in the same number of decode steps at most) with its weight switch: one rollout phase bounds it."""
        return self.rollout_s + self.switch_s


VENDOR_STEPS: dict[str, VendorStep] = {
    "a3-256die-true-weight": VendorStep(859.68, 373.65, 17.0, "true weight, deepscaler, step 2"),
    "a3-256die-random-init": VendorStep(796.8, 318.27, 35.63, "random init, gsm8k, step 5"),
}


def vendor_step(profile: str | None) -> VendorStep | None:
    """The vendor's figures for an A3 profile (``overlay.profile``), None for a layout the vendor did not run."""
    return VENDOR_STEPS.get(profile or "")


def human_bytes(nbytes: float) -> str:
    """Decimal units, as storage is sold and ``df -H`` shows it."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{nbytes:.0f} B"


def human_seconds(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


__all__ = [
    "CHECKPOINT_BYTES_NOTE",
    "CHECKPOINT_BYTES_PER_PARAM",
    "CheckpointStep",
    "VENDOR_SOURCE",
    "VENDOR_STEPS",
    "VendorStep",
    "checkpoint_step",
    "human_bytes",
    "human_seconds",
    "room_needed",
    "saves_in_run",
    "vendor_step",
]
