"""The type-check gate: mypy, strict, over the packages pyproject.toml's ``[tool.mypy] files`` lists (the one
place that names them; widen the gate there once a package checks clean). Our other packages are read for
their types, the upstream trees not at all (pyproject's overrides), so an error here is one in our code.

mypy's cache lives in the user's cache (``user_cache_dir() / "mypy"``), never in the repo: a warm run takes
a few seconds, a cold one about half a minute of CPU.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from verl_patches.base.user_cache import user_cache_dir

ROOT = Path(__file__).parents[2]
PYPROJECT = ROOT / "pyproject.toml"
# mypy's error lines: path:line: error: message  [code]
_ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+: error: ")


def mypy_settings() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["tool"]["mypy"]


def strict_packages() -> list[str]:
    """The folders the gate checks, as pyproject.toml lists them (relative to the repo root)."""
    return list(mypy_settings()["files"])


def run_mypy(args: list[str], cache_dir: Path) -> subprocess.CompletedProcess[str]:
    if importlib.util.find_spec("mypy") is None:
        pytest.fail(f"mypy is not installed for {sys.executable}: requirements-test.txt pins it")
    command = [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(cache_dir)]
    return subprocess.run([*command, *args], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_strict_packages_are_our_packages() -> None:
    """Each entry of the list is a package of verl_patches that exists: a typo would check nothing."""
    packages = strict_packages()
    assert packages, f"{PYPROJECT.name}: [tool.mypy] files is empty; the gate would check nothing"
    for entry in packages:
        folder = ROOT / entry
        assert entry.startswith("verl_patches/") and (folder / "__init__.py").is_file(), (
            f"{PYPROJECT.name}: [tool.mypy] files: {entry!r} is not a package folder of verl_patches"
        )
    assert len(set(packages)) == len(packages), f"{PYPROJECT.name}: [tool.mypy] files lists a folder twice"


def test_settings_are_strict() -> None:
    """The gate is only as strong as these switches; turning one off is a decision to make here, on purpose."""
    settings = mypy_settings()
    assert settings.get("strict") is True, f"{PYPROJECT.name}: [tool.mypy] strict must be true"
    assert settings.get("warn_unreachable") is True, f"{PYPROJECT.name}: [tool.mypy] warn_unreachable must be true"
    assert settings.get("follow_imports") == "silent", (
        f"{PYPROJECT.name}: [tool.mypy] follow_imports must be 'silent': our other packages are read for their "
        "types (skipping them would turn their names into Any and hide mismatches at the seams)"
    )


def test_strict_packages_type_check() -> None:
    packages = strict_packages()
    done = run_mypy(packages, user_cache_dir() / "mypy")
    matches = [m for m in map(_ERROR.match, done.stdout.splitlines()) if m is not None]
    by_package: dict[str, int] = {}
    for m in matches:
        path = m["path"]
        package = next((p for p in packages if path.startswith(p.rstrip("/") + "/")), path)
        by_package[package] = by_package.get(package, 0) + 1
    counts = ", ".join(f"{p}: {n}" for p, n in sorted(by_package.items()))
    assert done.returncode == 0 and not matches, (
        f"mypy found {len(matches)} error(s) ({counts or 'none parsed'}) in the strict packages; fix the code or "
        f"the annotation (pyproject.toml [tool.mypy]):\n"
        + "\n".join(done.stdout.splitlines()[-200:])
        + done.stderr[-2000:]
    )


def test_gate_refuses_untyped_code(tmp_path: Path) -> None:
    """The same settings fail a function without annotations and an Optional used as its value: the gate
    is strict, not just run."""
    sample = tmp_path / "sample_module.py"
    sample.write_text(
        "from __future__ import annotations\n\n\n"
        "def untyped(x):\n    return x\n\n\n"
        "def first(names: list[str] | None) -> str:\n    return names[0]\n",
        encoding="utf-8",
    )
    done = run_mypy([str(sample)], tmp_path / "cache")
    assert done.returncode == 1, f"mypy passed code the gate must refuse:\n{done.stdout}{done.stderr}"
    assert "[no-untyped-def]" in done.stdout and "[index]" in done.stdout, done.stdout
