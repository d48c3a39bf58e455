"""Helpers for the patching tests: fresh interpreters, throwaway modules, free ports.

Anything that touches upstream modules or the process-wide registry runs in a fresh interpreter
(`run_python`), so no test sees another's sys.modules. Unit tests of the registry build Registry
objects over small throwaway modules written to tmp_path (`Scratch`).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
PIN = "verl refs/tags/v0.4.0 @ 0758489422e8"


def clean_env(extra: dict[str, str] | None = None, pythonpath: tuple[str | Path, ...] = ()) -> dict[str, str]:
    """The caller's environment without our own switches, with the repo root importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERL_PATCHES_")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, pythonpath), str(REPO)])
    env["PYTHONWARNINGS"] = "ignore"
    env.update(extra or {})
    return env


def run_python(
    code: str,
    *,
    env: dict[str, str] | None = None,
    pythonpath: tuple[str | Path, ...] = (),
    cwd: Path | str = REPO,
    timeout: float = 180,
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-c", textwrap.dedent(code)],
        cwd=str(cwd),
        env=clean_env(env, pythonpath),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_json(code: str, **kwargs) -> tuple[dict, str]:
    """Run code that prints one JSON object as its last stdout line; returns (object, stderr)."""
    r = run_python(code, **kwargs)
    assert r.returncode == 0, f"subprocess failed (rc={r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert lines, f"no output; stderr:\n{r.stderr[-4000:]}"
    return json.loads(lines[-1]), r.stderr


@dataclass
class Scratch:
    """A throwaway top-level package on sys.path; modules written into it import normally."""

    package: str
    root: Path

    def write(self, name: str, source: str) -> str:
        """Write module `package.name` (dots make subpackages) and return its dotted name."""
        parts = name.split(".")
        folder = self.root / self.package
        for part in parts[:-1]:
            folder = folder / part
            folder.mkdir(exist_ok=True)
            (folder / "__init__.py").touch()
        (folder / f"{parts[-1]}.py").write_text(textwrap.dedent(source))
        importlib.invalidate_caches()
        return f"{self.package}.{name}"

    def forget(self) -> None:
        for mod in [m for m in sys.modules if m == self.package or m.startswith(self.package + ".")]:
            del sys.modules[mod]


def manifest_by_name(manifest: list[dict]) -> dict[str, dict]:
    return {m["name"]: m for m in manifest}


def dumps(obj) -> str:
    return json.dumps(obj, default=str)
