"""The two test tiers and what each took.

The fast tier (`pytest -m "not slow"`, in two processes with `-n 2`) is what a developer runs between edits:
budget 10 minutes on a 2-core machine. README's test command (.ci/run) runs the whole suite in two parts:
everything but the tiny-run jobs of tests/e2e in two processes (`pytest -n 2 --ignore=tests/e2e`, part
`all-but-e2e`), then tests/e2e one test at a time (`pytest tests/e2e`, part `e2e`: each tiny run keeps both
cores busy, and its checks of time-outs and exits assume it has them). Plain `pytest` is the `full` suite in
one process; `pytest -m slow` the `slow` tier alone. Each tier keeps its durations: the last run of a tier is
stored under the user's cache
(`~/.cache/verl_patches/test-durations/<tier>.json`) and the summary compares this run with it, so a test that
slipped into the fast tier, or a tier that grew, shows up at the next run rather than in CI. Nothing here fails
a run: speed is measured by benchmarks, not by timed tests.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from verl_patches.base.atomic_write import write_json_atomically

FAST_TIER_BUDGET_S = 600.0
# A test of the fast tier that takes longer than this belongs in the slow tier.
FAST_TEST_LIMIT_S = 20.0


E2E = "tests/e2e"


def _norm(paths: list[str]) -> list[str]:
    return sorted(p.rstrip("/").removeprefix("./") for p in paths)


def tier_name(
    markexpr: str, paths: list[str] | None = None, testpaths: list[str] | None = None, ignored: Sequence[str] = ()
) -> str:
    """The tier a run is (pure): `fast` / `slow` for the two marker expressions over the whole suite, `full` for
    the whole suite, `all-but-e2e` / `e2e` for the two parts of README's command; anything else `custom`
    (a run of some files, another marker expression, other ignores)."""
    expr = " ".join(markexpr.split())
    testpaths = ["tests"] if testpaths is None else testpaths
    paths, ignored = _norm(testpaths if paths is None else paths), _norm(list(ignored or ()))
    if paths == [E2E] and not expr and not ignored:
        return "e2e"
    if paths != _norm(testpaths):
        return "custom"
    if ignored:
        return "all-but-e2e" if ignored == [E2E] and not expr else "custom"
    return {"": "full", "not slow": "fast", "slow": "slow"}.get(expr, "custom")


def durations_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "verl_patches" / "test-durations"


def slow_in_fast_tier(durations: dict[str, float], slow_ids: set[str], limit_s: float) -> list[tuple[str, float]]:
    """Tests not marked slow that took longer than `limit_s`, longest first."""
    late = [(nodeid, s) for nodeid, s in durations.items() if nodeid not in slow_ids and s > limit_s]
    return sorted(late, key=lambda item: -item[1])


class TierReport:
    def __init__(self, config: pytest.Config) -> None:
        # A run of some files only (`pytest tests/x`) is no tier, whatever its marker expression.
        self.tier = tier_name(
            config.getoption("markexpr", "") or "",
            list(config.args),
            list(config.getini("testpaths")),
            config.getoption("ignore", None) or (),
        )
        self.started = time.monotonic()
        self.durations: dict[str, float] = {}
        self.slow_ids: set[str] = set()
        self.selected = 0

    # Under pytest-xdist this runs in the controller only (conftest.py), which collects nothing: the tests and
    # their markers then come from the reports the workers send.
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.slow_ids = {item.nodeid for item in items if item.get_closest_marker("slow")}

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = len(session.items)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration
        if "slow" in report.keywords:
            self.slow_ids.add(report.nodeid)

    def pytest_terminal_summary(self, terminalreporter) -> None:  # noqa: ANN001 (pytest's TerminalReporter)
        if self.tier == "custom" or not self.durations:
            return
        wall = time.monotonic() - self.started
        path = durations_dir() / f"{self.tier}.json"
        previous = None
        try:
            previous = json.loads(path.read_text()).get("wall_s")
        except (OSError, ValueError, AttributeError):
            pass
        workers = getattr(terminalreporter.config.option, "numprocesses", None)
        line = f"tier {self.tier}: {self.selected or len(self.durations)} tests in {wall:.0f} s"
        if workers:
            line += f" ({workers} workers)"
        if self.tier == "fast":
            line += f" (budget {FAST_TIER_BUDGET_S:.0f} s)"
        if isinstance(previous, (int, float)):
            line += f"; last run of this tier: {previous:.0f} s"
        terminalreporter.write_sep("-", line)
        for nodeid, seconds in slow_in_fast_tier(self.durations, self.slow_ids, FAST_TEST_LIMIT_S):
            terminalreporter.write_line(
                f"  {seconds:.0f} s, not marked slow (the fast tier's limit is {FAST_TEST_LIMIT_S:.0f} s): {nodeid}"
            )
        # A partial run (-x, a keyword filter, an interrupted session) is not the tier's measurement.
        if terminalreporter.config.getoption("keyword", "") or terminalreporter.config.getoption("exitfirst", False):
            return
        record = {
            "wall_s": round(wall, 1),
            "tests": self.selected or len(self.durations),
            "durations_s": self.durations,
        }
        try:
            write_json_atomically(path, record)
        except OSError as err:
            terminalreporter.write_line(f"  durations not kept: {path}: {err.strerror}")
