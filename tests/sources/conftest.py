"""Fixtures for the sources tests (helpers live in sources_testlib.py).

Every test gets VERL_OVERLAY_CACHE inside its own tmp_path, a CPU host and a dead package index by
default, so nothing touches the real repo root's folders, its sources.lock or the user's download cache.
"""

from __future__ import annotations

import os

import pytest

from sources_testlib import LocalIndex, Upstream, alpha_lock, dead_url, make_upstream, run_setup


@pytest.fixture(autouse=True)
def isolated_env(tmp_path, monkeypatch):
    """Its own download cache, a CPU host, no mirror or index settings from outside."""
    cache = tmp_path / "user-cache"
    monkeypatch.setenv("VERL_OVERLAY_CACHE", str(cache))
    monkeypatch.setenv("VERL_PATCHES_DEVICE", "cpu")
    monkeypatch.delenv("VERL_OVERLAY_DEVICE", raising=False)  # the former name is refused, not ignored
    monkeypatch.setenv("VERL_OVERLAY_HTTP_TIMEOUT", "10")
    monkeypatch.setenv("VERL_OVERLAY_GIT_TIMEOUT", "60")
    # A dead index by default, so that nothing reaches a real index unless a test asks for it.
    monkeypatch.setenv("PIP_INDEX_URL", dead_url())
    for key in list(os.environ):
        if key.startswith("VERL_OVERLAY_GIT_MIRROR_"):
            monkeypatch.delenv(key)
    return cache


@pytest.fixture
def upstream(tmp_path) -> Upstream:
    return make_upstream(tmp_path / "upstream")


@pytest.fixture
def index(tmp_path):
    idx = LocalIndex(tmp_path / "index")
    yield idx
    idx.stop()


@pytest.fixture
def installed(tmp_path, upstream):
    """(lock, root): alpha installed by the git route from a lock with its manifests."""
    lock = alpha_lock(tmp_path, upstream)
    root = tmp_path / "root"
    r = run_setup("--route", "git", lock=lock, root=root)
    assert r.rc == 0, r.text
    return lock, root
