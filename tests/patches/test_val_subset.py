"""Validation on a fixed, bounded part of the test split (issue 34 item 2): the seeded sample, and the declared
patch of verl's ``RayPPOTrainer._create_dataloader`` that applies it, run on verl's own method."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_patches.data.val_subset import VAL_SUBSET_SEED, val_max_prompts, val_subset_indices
from verl_patches.patches.verl.trainer.val_subset import bounded_val_dataset, with_val_subset


def test_the_sample_is_fixed_sorted_and_bounded() -> None:
    picked = val_subset_indices(4031, 1024)
    assert picked is not None and len(picked) == 1024 == len(set(picked))
    assert picked == sorted(picked) and 0 <= picked[0] and picked[-1] < 4031
    assert val_subset_indices(4031, 1024) == picked  # every run of the same split validates on the same rows
    assert val_subset_indices(4031, 1024, seed=VAL_SUBSET_SEED + 1) != picked
    assert picked != list(range(1024))  # a sample over the whole split, not its head


@pytest.mark.parametrize("rows, bound", [(54, 1024), (1024, 1024), (10, None)])
def test_no_bound_or_a_split_within_it_is_the_whole_split(rows: int, bound: int | None) -> None:
    assert val_subset_indices(rows, bound) is None


@pytest.mark.parametrize("bad", [0, -3, 1.5, "1024", True])
def test_a_bound_that_is_not_a_positive_integer_is_refused_by_key(bad) -> None:
    with pytest.raises(ValueError, match=r"^overlay\.val_max_prompts="):
        val_max_prompts(bad)


def test_a_small_split_is_handed_on_as_the_same_object() -> None:
    data = list(range(54))  # the tiny run's test split: its validation must not change
    said: list[str] = []
    assert bounded_val_dataset(data, 1024, said.append) is data
    assert said == ["verl_patches validation: all 54 test prompts (overlay.val_max_prompts=1024 is not below them)"]


def trainer_config(bound) -> OmegaConf:
    return OmegaConf.create(
        {
            "overlay": {"val_max_prompts": bound},
            "data": {"train_batch_size": 4, "dataloader_num_workers": 0, "val_batch_size": None},
            "trainer": {"total_epochs": 1, "total_training_steps": None},
            "actor_rollout_ref": {"actor": {"optim": {}}},
        }
    )


class FakeTrainer:
    def __init__(self, bound) -> None:
        self.config = trainer_config(bound)
        self.tokenizer = self.processor = None


@pytest.mark.parametrize("bound, expect", [(1024, 1024), (None, 3000), (5000, 3000)])
def test_verls_dataloader_validates_on_the_subset(bound, expect: int) -> None:
    from torch.utils.data import SequentialSampler
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    train, val = list(range(64)), [{"row": i} for i in range(3000)]
    trainer = FakeTrainer(bound)
    create = with_val_subset(RayPPOTrainer._create_dataloader)
    create(trainer, train, val, lambda rows: rows, SequentialSampler(train))
    assert len(trainer.val_dataset) == expect
    (batch,) = list(trainer.val_dataloader)  # verl sends the whole validation set as one batch
    rows = [r["row"] for r in batch]
    assert len(rows) == expect
    if bound == 1024:
        assert rows == val_subset_indices(3000, 1024)  # the seeded sample, in file order
    assert len(trainer.train_dataloader) == 16  # the training side is untouched


def test_the_patch_is_declared_on_verls_method_at_its_pin() -> None:
    from verl_patches.patches.verl.trainer.declarations import PATCHES
    from verl_patches.patching.fingerprint import fingerprint_target

    (patch,) = [p for p in PATCHES if p.name == "trainer.val_subset"]
    assert patch.target == "verl.trainer.ppo.ray_trainer:RayPPOTrainer._create_dataloader"
    assert fingerprint_target(patch.target) == patch.fingerprint
