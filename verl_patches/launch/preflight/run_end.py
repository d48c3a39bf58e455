"""Preflight ``run.end``: when the run will end, in steps and hours, and a warning when that is sooner than asked.

verl v0.4.0 runs ``trainer.total_epochs`` passes over the training data, ``len(dataloader)`` steps each (the rows
over ``data.train_batch_size``, the last partial batch dropped), and stops early at
``trainer.total_training_steps`` when that is set: the run ends at the smaller of the two. The A3 profiles set
``total_epochs: 1`` and no step count, so a full run on DeepScaleR's 36k training prompts ends after ~70 steps
(~17 h): fine for a first run, a surprise in a week's booking. And a ``total_training_steps`` larger than the
epochs allow is never reached. Both are said once, as a warning naming the key.

Hours are the steps times the vendor's measured step time for the profile's layout (`run_costs.VENDOR_STEPS`,
859.68 s a step with real weights), stated as such; validation and checkpoint saves come on top (their own lines).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_patches.launch.preflight.files import parquet_rows
from verl_patches.launch.preflight.findings import OK, WARN, Context, Finding, get
from verl_patches.launch.preflight.run_costs import VENDOR_SOURCE, human_seconds, vendor_step

CHECK = "run.end"
STEPS_KEY, EPOCHS_KEY = "trainer.total_training_steps", "trainer.total_epochs"


@dataclass(frozen=True)
class RunLength:
    """How many steps the run takes and what ends it (pure arithmetic over the config and the data size)."""

    steps: int | None  # None: the data size is not known here and no step count bounds it
    ended_by: str  # STEPS_KEY or EPOCHS_KEY
    epochs: int
    per_epoch: int | None  # steps per epoch, None when the data size is not known here
    asked: int | None  # trainer.total_training_steps, None when unset

    @property
    def step_count_unreached(self) -> bool:
        """``total_training_steps`` is set but the epochs end the run first."""
        return self.asked is not None and self.ended_by == EPOCHS_KEY


def run_length(asked: int | None, epochs: int, train_rows: int | None, batch: int) -> RunLength:
    """verl's end of a run: ``min(total_training_steps, total_epochs x rows // train_batch_size)``."""
    per_epoch = None if train_rows is None or batch <= 0 else train_rows // batch
    by_epochs = None if per_epoch is None else max(epochs, 0) * per_epoch
    if asked is not None and asked > 0 and (by_epochs is None or asked <= by_epochs):
        return RunLength(asked, STEPS_KEY, epochs, per_epoch, asked)
    return RunLength(by_epochs, EPOCHS_KEY, epochs, per_epoch, asked if asked is not None and asked > 0 else None)


def run_end_text(
    length: RunLength, batch: int, rows: int | None, step_s: float | None, filtered: bool, cluster: bool
) -> Finding:
    """The ``run.end`` line (pure): steps, what ends the run, hours at ``step_s``; a warning where the end comes
    sooner than asked (a step count the epochs never reach) or from the A3 profiles' single epoch."""
    at_most = "at most " if filtered else ""
    if length.per_epoch is None:
        epoch = f"train rows / {batch} steps per epoch (the data is read where the job runs)"
    else:
        epoch = f"{length.per_epoch} steps per epoch ({rows} train rows // data.train_batch_size {batch})"
    if length.ended_by == STEPS_KEY:
        text = f"the run ends after {at_most}{length.steps} steps ({STEPS_KEY}; {length.epochs} epoch(s) of {epoch})"
    elif length.steps is None:
        text = f"the run ends after {EPOCHS_KEY}={length.epochs} pass(es) over the data: {epoch}"
    else:
        text = f"the run ends after {at_most}{length.steps} steps: {EPOCHS_KEY}={length.epochs} x {epoch}"
    if filtered:
        text += "; prompts over data.max_prompt_length are dropped first (data.filter_overlong_prompts)"
    if length.steps is not None and step_s:
        text += f"; about {human_seconds(length.steps * step_s)} at {step_s:g} s a step ({VENDOR_SOURCE}), "
        text += "validation and checkpoint saves not counted"
    elif length.steps is not None:
        text += "; no measured step time for this layout, so no hours"
    if length.step_count_unreached:
        need = -(-length.asked // length.per_epoch) if length.per_epoch else None
        more = f"; raise {EPOCHS_KEY} to {need} to reach it" if need else f"; raise {EPOCHS_KEY}"
        return Finding(
            CHECK, WARN, f"{text}: {STEPS_KEY}={length.asked} is never reached{more}", f"{EPOCHS_KEY}, {STEPS_KEY}"
        )
    if cluster and length.asked is None and length.epochs == 1:
        return Finding(
            CHECK,
            WARN,
            f"{text}: one pass over the data ends the run; for a longer run raise {EPOCHS_KEY} (and bound it with "
            f"{STEPS_KEY})",
            EPOCHS_KEY,
        )
    return Finding(CHECK, OK, text)


def run_end_findings(ctx: Context) -> list[Finding]:
    """The preflight's ``run.end`` line for this config and the data on this host."""
    asked = get(ctx.cfg, STEPS_KEY)
    epochs = int(get(ctx.cfg, EPOCHS_KEY, 1) or 0)
    batch = int(get(ctx.cfg, "data.train_batch_size", 0) or 0)
    rows = parquet_rows(ctx, "data.train_files")
    length = run_length(int(asked) if asked is not None else None, epochs, rows, batch)
    vendor = vendor_step(ctx.overlay.profile)
    return [
        run_end_text(
            length,
            batch,
            rows,
            vendor.step_s if vendor else None,
            bool(get(ctx.cfg, "data.filter_overlong_prompts", False)),
            ctx.cluster_profile,
        )
    ]


__all__ = ["CHECK", "RunLength", "run_end_findings", "run_end_text", "run_length"]
