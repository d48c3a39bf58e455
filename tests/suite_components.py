"""Which upstream components a test needs, and what happens when one is absent.

`@pytest.mark.needs_components("mindspeed", "mindspeed_llm")` (or the `require_components` function) skips
the test with the reason on a developer's or user's machine that has no route to a git-only component, and
FAILS it under CI (`CI=true`): CI installs every component (from ../shared/sources-cache when git is out of
reach), so a missing one there is a broken set-up, never a reason to skip.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from verl_patches.base.env_flags import env_flag

REPO = Path(__file__).resolve().parents[1]


def under_ci() -> bool:
    return env_flag("CI")


def locked_packages() -> dict[str, str]:
    """component name -> package folder, from sources.lock."""
    lock = tomllib.loads((REPO / "sources.lock").read_text(encoding="utf-8"))
    return {name: comp.get("package", name) for name, comp in lock["components"].items()}


def missing_components(names: tuple[str, ...] | list[str] = ()) -> list[str]:
    packages = locked_packages()
    unknown = [n for n in names if n not in packages]
    if unknown:
        raise ValueError(f"needs_components: {', '.join(unknown)} not in sources.lock")
    return [n for n in (names or tuple(packages)) if not _populated(REPO / packages[n])]


def _populated(folder: Path) -> bool:
    # megatron is a namespace package (no __init__.py at its top): any Python file below counts
    return folder.is_dir() and next(folder.rglob("*.py"), None) is not None


def require_components(*names: str) -> None:
    """Skip (fail under CI) unless every named component's package folder is installed at the repo root."""
    missing = missing_components(names)
    if not missing:
        return
    why = (
        f"{', '.join(missing)} not installed at the repo root (git-only; on a machine without git access run "
        f"`bash setup_sources.sh --cache DIR` with a cache exported by `setup_sources.sh --export-cache`)"
    )
    if under_ci():
        pytest.fail(f"CI must have every component: {why}", pytrace=False)
    pytest.skip(why)
