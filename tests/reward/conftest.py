"""Shared fixtures of the reward tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from verl_patches.reward.guarded_pool import GuardedPool, PoolConfig


@pytest.fixture(scope="module")
def pool() -> Iterator[GuardedPool]:
    """Two grader workers for a test module, closed after its last test (test_reward_time_bound.py warms its own
    up first)."""
    pool = GuardedPool(PoolConfig(max_workers=2))
    yield pool
    pool.close()
