"""The e2e tests' shared tiny A3-path run: ONE 60-step run of README command 1 per test session serves every
test that needs it (the A3-path checks and golden baseline in test_tiny_grpo.py, and the uninterrupted
reference of the kill-and-resume test), so the suite pays for one tiny run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiny_job import TinyRun, run_tiny


@pytest.fixture(scope="session")
def tiny_a3_assets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run's assets folder (data, tokenizer, model, converted checkpoint), built by the first run."""
    return tmp_path_factory.mktemp("tiny_a3_assets")


@pytest.fixture(scope="session")
def a3_run(tmp_path_factory: pytest.TempPathFactory, tiny_a3_assets: Path) -> TinyRun:
    """README command 1, as is (60 steps, validation every 20, seed 1), with its own log folder."""
    return run_tiny(tmp_path_factory.mktemp("tiny_logs"), tiny_a3_assets, timeout=2300)
