"""``RayPPOTrainer._create_dataloader``: validate on a fixed, bounded part of the test split
(``overlay.val_max_prompts``, `verl_patches.data.val_subset`), so a validation on A3 costs one batch of the
rollout engines whatever test split was made. Without the key (verl's own configs) or with a split no larger
than the bound, the dataset verl built is used as it is."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from verl_patches.base.overlay_settings import overlay_settings
from verl_patches.data.val_subset import VAL_MAX_PROMPTS_KEY, val_max_prompts, val_subset_indices

LOG_PREFIX = "verl_patches validation:"


def bounded_val_dataset(dataset: Any, max_prompts: Any, say: Callable[[str], None] = print) -> Any:
    """``dataset`` itself, or a `torch.utils.data.Subset` of the seeded sample of ``max_prompts`` rows."""
    bound = val_max_prompts(max_prompts)
    rows = len(dataset)
    indices = val_subset_indices(rows, bound)
    if indices is None:
        if bound is not None:
            say(f"{LOG_PREFIX} all {rows} test prompts ({VAL_MAX_PROMPTS_KEY}={bound} is not below them)")
        return dataset
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    from torch.utils.data import Subset

    say(f"{LOG_PREFIX} {len(indices)} of {rows} test prompts ({VAL_MAX_PROMPTS_KEY}={bound}, a fixed seeded sample)")
    return Subset(dataset, indices)


def with_val_subset(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _create_dataloader(self: Any, train_dataset: Any, val_dataset: Any, collate_fn: Any, train_sampler: Any):
        bound = overlay_settings(self.config).val_max_prompts
        if bound is not None:
            if val_dataset is None:  # as upstream builds it, so that the bound applies to the same rows
                # deferred: a patch applies while upstream is still importing; verl is read at call time
                from verl.trainer.main_ppo import create_rl_dataset

                val_dataset = create_rl_dataset(
                    self.config.data.val_files, self.config.data, self.tokenizer, self.processor
                )
            val_dataset = bounded_val_dataset(val_dataset, bound)
        return original(self, train_dataset, val_dataset, collate_fn, train_sampler)

    return _create_dataloader


__all__ = ["LOG_PREFIX", "bounded_val_dataset", "with_val_subset"]
