"""Fixtures of the run of vllm-ascend's own tests: the pinned tests on disk, and the local model cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from suite_components import under_ci
from upstream_models import build_hub_cache
from verl_patches.sources import upstream_tests
from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.lock import load_lock

REPO = Path(__file__).resolve().parents[2]
COMPONENT = "vllm_ascend"


@pytest.fixture(scope="session")
def upstream_rootdir() -> Path:
    """The folder holding vllm-ascend's pinned `tests/` (unpacked from the lock's sdist, its hashes checked)."""
    try:
        folder = upstream_tests.install(REPO, load_lock(REPO / "sources.lock"), COMPONENT)
    except RouteUnavailable as e:  # no cached sdist and no index: a developer's offline machine
        why = f"vllm-ascend's pinned tests cannot be unpacked here: {e}"
        if under_ci():
            pytest.fail(f"CI must have them: {why}", pytrace=False)
        pytest.skip(why)
    except IntegrityError as e:
        pytest.fail(f"vllm-ascend's pinned tests: {e}", pytrace=False)
    return folder.parent


@pytest.fixture(scope="session")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Hugging Face hub cache holding small local models under the names upstream's tests load."""
    return build_hub_cache(tmp_path_factory.mktemp("hub-cache"))
