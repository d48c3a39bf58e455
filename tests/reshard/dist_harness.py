"""Named scenarios on N CPU ranks over gloo (`verl_patches.multirank`), one spawn serving many test functions.

The target runs named scenarios and returns ``{scenario: "ok" | traceback}``; a scenario that fails on one rank
is recorded and the rest still run, which is why each collective is bounded by a quarter of the run's deadline
(`run_scenario_ranks`): a peer left waiting by a failed scenario gets an error, not the whole deadline.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

from verl_patches.multirank import run_ranks


def run_scenarios(scenarios: dict[str, Callable[[int, int], None]], rank: int, world: int) -> dict[str, str]:
    """Run every scenario in order on this rank; a failure is recorded, the rest still run.

    Scenarios are collective: a rank that fails mid-scenario may leave peers waiting, which the gloo
    timeout turns into errors on those peers rather than a hang.
    """
    results = {}
    for name, fn in scenarios.items():
        try:
            fn(rank, world)
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()
    return results


def run_scenario_ranks(
    target: Callable[[int, int], dict[str, str]], world: int, timeout_s: float = 90.0
) -> list[dict[str, str]]:
    """Each rank's ``{scenario: "ok" | traceback}``, in rank order; collectives time out at ``timeout_s / 4``."""
    return run_ranks(target, world, timeout_s, group_timeout_s=timeout_s / 4)


def assert_scenario(results: list[dict[str, str]], name: str) -> None:
    failures = {r: res.get(name, "scenario did not run") for r, res in enumerate(results) if res.get(name) != "ok"}
    assert not failures, "\n".join(f"--- rank {r} ---\n{tb}" for r, tb in failures.items())
