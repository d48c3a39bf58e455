"""Executors on 8 gloo processes: bit-identical to all-gather-then-slice, bytes as the cost model says.

One spawn runs every scenario of `multiproc_scenarios` (process start-up dominates the time); each test
below asserts one scenario on every rank.
"""

from __future__ import annotations

import pytest

from tests.reshard.dist_harness import assert_scenario, run_scenario_ranks
from tests.reshard.multiproc_scenarios import SCENARIOS, run_all

# About 10 s on an idle 2-core host (spawning 8 interpreters dominates), 20-40 s when the host is busy.
pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


@pytest.fixture(scope="module")
def results():
    return run_scenario_ranks(run_all, world=8, timeout_s=100)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_scenario(results, scenario):
    assert_scenario(results, scenario)
