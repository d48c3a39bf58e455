"""The tier reporter's pure parts: which tier a marker expression is, and which tests outgrew the fast tier."""

from __future__ import annotations

import pytest

from tier_report import slow_in_fast_tier, tier_name


@pytest.mark.parametrize(
    ("expr", "tier"),
    [("", "full"), ("not slow", "fast"), ("  not   slow ", "fast"), ("slow", "slow"), ("not network", "custom")],
)
def test_tier_name(expr: str, tier: str) -> None:
    assert tier_name(expr) == tier


@pytest.mark.parametrize(
    ("expr", "paths", "ignored", "tier"),
    [
        ("", ["tests"], ["tests/e2e"], "all-but-e2e"),
        ("", ["tests"], ["tests/e2e/"], "all-but-e2e"),
        ("", ["tests/e2e"], [], "e2e"),
        ("", ["tests/e2e/"], [], "e2e"),
        ("slow", ["tests/e2e"], [], "custom"),
        ("not slow", ["tests"], ["tests/e2e"], "custom"),
        ("", ["tests"], ["tests/sync"], "custom"),
        ("", ["tests/sync"], [], "custom"),
        ("", ["tests"], [], "full"),
        ("not slow", ["tests"], [], "fast"),
    ],
)
def test_the_parts_of_readmes_command_are_tiers_of_their_own(expr, paths, ignored, tier) -> None:
    assert tier_name(expr, paths, ["tests"], ignored) == tier


def test_slow_in_fast_tier_names_unmarked_long_tests_longest_first() -> None:
    durations = {"a::quick": 0.5, "b::long": 31.0, "c::marked": 300.0, "d::longer": 45.0}
    assert slow_in_fast_tier(durations, {"c::marked"}, 20.0) == [("d::longer", 45.0), ("b::long", 31.0)]


def test_the_slow_marker_is_declared_for_the_split() -> None:
    import tomllib
    from pathlib import Path

    config = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    markers = config["tool"]["pytest"]["ini_options"]["markers"]
    assert any(m.startswith("slow:") for m in markers)
