"""CI's machines reach PyPI but no git host: every component must still be installed there."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from suite_components import REPO, locked_packages, missing_components, require_components, under_ci


def test_every_locked_component_is_installed_under_ci() -> None:
    missing = missing_components()
    if missing and not under_ci():
        pytest.skip(f"{', '.join(missing)} not installed here (optional on a CPU host; CI installs them)")
    assert not missing, f"CI must install every component (.ci/run uses ../shared/sources-cache): missing {missing}"


def test_require_components_skips_outside_ci_and_fails_under_ci(tmp_path, monkeypatch) -> None:
    """The rule itself, on a component made to look absent."""
    import suite_components

    monkeypatch.setattr(suite_components, "REPO", tmp_path)
    (tmp_path / "sources.lock").write_text((REPO / "sources.lock").read_text())
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception, match="mindspeed not installed.*--cache DIR"):
        require_components("mindspeed")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must have every component: mindspeed not installed"):
        require_components("mindspeed")
    with pytest.raises(ValueError, match="not_a_component not in sources.lock"):
        require_components("not_a_component")


def test_ci_script_installs_from_the_exported_cache_and_runs_the_readme_command() -> None:
    ci = (REPO / ".ci" / "run").read_text()
    readme = (REPO / "README.md").read_text()
    command = (
        "bash verl_patches/scripts/setup_cpu_env.sh && .venv/bin/python -m pytest -n 2 --ignore=tests/e2e "
        "&& .venv/bin/python -m pytest tests/e2e"
    )
    assert command in readme and ci.rstrip().splitlines()[-1] == command
    assert "../shared/sources-cache" in ci and "VERL_OVERLAY_SOURCES_CACHE" in ci
    assert set(locked_packages()) >= {"mindspeed", "mindspeed_llm", "megatron"}


def test_sources_cache_env_is_the_default_cache_dir(tmp_path) -> None:
    """`VERL_OVERLAY_SOURCES_CACHE` is what `--cache DIR` defaults to: an empty one is a clear route error."""
    env = {**os.environ, "VERL_OVERLAY_SOURCES_CACHE": str(tmp_path / "nowhere"), "PYTHONPATH": str(REPO)}
    r = subprocess.run(
        [sys.executable, "-c", "from verl_patches.sources.__main__ import parse_args; print(parse_args([]).cache)"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(tmp_path / "nowhere")
