"""Our code run as a user or the job starts it: `python ARGS` in a fresh interpreter from the repo root, its
output captured as text, under a deadline. For the tests that check a command's exit status, output or messages
(a module's CLI, a probe script, code given with -c)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fresh_python(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """`python *args` with this interpreter from the repo root; `env`, when given, is its whole environment."""
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
