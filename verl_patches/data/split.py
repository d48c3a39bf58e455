"""The train/test plan: seeded shuffle of distinct problems, duplicates kept together on one side."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from verl_patches.data.errors import SplitError


@dataclass(frozen=True)
class SplitPlan:
    train: tuple[int, ...]  # positions into the examples, in output order
    test: tuple[int, ...]
    duplicate_groups: tuple[tuple[int, ...], ...]  # positions sharing one problem text


def problem_key(problem: str) -> str:
    """Problems that differ only in whitespace are the same problem."""
    return " ".join(problem.split())


def plan_split(problems: Sequence[str], train_ratio: float, seed: int) -> SplitPlan:
    """Shuffle distinct problems with `seed`, fill train to round(ratio * rows), the rest is test."""
    if not 0.0 < train_ratio < 1.0:
        raise ValueError(f"train ratio must be in (0, 1), got {train_ratio}")
    groups: dict[str, list[int]] = {}
    for position, problem in enumerate(problems):
        groups.setdefault(problem_key(problem), []).append(position)
    if len(groups) < 2:
        raise SplitError(
            f"need at least 2 distinct valid problems to make a train and a test split, found {len(groups)}"
        )
    order = list(groups.values())
    random.Random(seed).shuffle(order)
    target = min(max(round(train_ratio * len(problems)), 1), len(problems) - 1)
    train: list[int] = []
    test: list[int] = []
    for group in order:
        if not train or len(train) + len(group) <= target:
            train.extend(group)
        else:
            test.extend(group)
    if not test:  # every group fitted: give the last one to test
        last = order[-1]
        del train[len(train) - len(last) :]
        test.extend(last)
    duplicates = tuple(tuple(group) for group in groups.values() if len(group) > 1)
    return SplitPlan(tuple(train), tuple(test), duplicates)
