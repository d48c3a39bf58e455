"""The tree is clean under the formatter and linter configured in pyproject.toml (ruff), so .ci/run, which runs
README's test command, keeps it that way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_clean(args: list[str]) -> None:
    ruff = Path(sys.executable).with_name("ruff")
    if not ruff.exists():
        pytest.fail(f"ruff is not installed next to {sys.executable}: requirements-test.txt pins it")
    done = subprocess.run([str(ruff), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"ruff {' '.join(args)} found:\n{done.stdout[-6000:]}{done.stderr[-2000:]}"
