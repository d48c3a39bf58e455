"""The fixed part of the test split a run validates on (``overlay.val_max_prompts``).

verl v0.4.0 validates on the whole ``data.val_files`` every ``trainer.test_freq`` steps and has no key to
take part of it. On A3 a validation's time is set by the decode steps of its longest response, not by the
number of prompts, as long as every rollout engine holds its share in one batch (``max_num_seqs``); a bound
on the prompts keeps it one batch whatever test split the user made, and makes runs comparable.

The subset is a seeded sample of row positions, the same for every run of the same split (the seed is fixed,
not ``data.seed``, so that changing the training order does not change what is measured), kept in file
order. Pure: the trainer-side patch (`patches/verl/trainer/val_subset.py`) applies it to verl's dataset.
"""

from __future__ import annotations

import random
from typing import Any

VAL_MAX_PROMPTS_KEY = "overlay.val_max_prompts"
VAL_SUBSET_SEED = 0


def val_max_prompts(value: Any) -> int | None:
    """The configured bound: None (the whole split) or an integer >= 1; ValueError naming the key otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{VAL_MAX_PROMPTS_KEY}={value!r}: expected a positive integer or null (the whole split)")
    return value


def val_subset_indices(n_rows: int, max_prompts: int | None, seed: int = VAL_SUBSET_SEED) -> list[int] | None:
    """Row positions to validate on, ascending; None when the whole split is used (no bound, or the split is
    not larger than it)."""
    bound = val_max_prompts(max_prompts)
    if bound is None or n_rows <= bound:
        return None
    return sorted(random.Random(seed).sample(range(n_rows), bound))


__all__ = ["VAL_MAX_PROMPTS_KEY", "VAL_SUBSET_SEED", "val_max_prompts", "val_subset_indices"]
