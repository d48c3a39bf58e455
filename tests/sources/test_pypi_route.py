"""The PyPI route against a local PEP 503 index on 127.0.0.1, plus one check against the real index."""

from __future__ import annotations

import hashlib
import json
import urllib.request

import pytest

from sources_testlib import (
    PRELUDE_LINE,
    REPO_ROOT,
    SDIST_FILE,
    V1_FILES,
    WHEEL_FILE,
    alpha_component,
    dead_url,
    make_sdist,
    make_wheel,
    pristine_hash,
    pypi_hash_v1,
    reference_tree_hash,
    run_setup,
    snapshot,
    write_lock,
)
from verl_patches.sources import prelude_line, pypi_route
from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.extract import extract_subdir
from verl_patches.sources.lock import load_lock
from verl_patches.sources.treehash import tree_hash


def _lock(tmp_path, up, index, **kw):
    return write_lock(tmp_path / "lock" / "sources.lock", {"alpha": alpha_component(up, index, **kw)})


@pytest.mark.parametrize("artifact", [WHEEL_FILE, SDIST_FILE], ids=["wheel", "sdist"])
def test_correct_artifact_installs(tmp_path, upstream, index, isolated_env, artifact):
    data = make_wheel(V1_FILES) if artifact == WHEEL_FILE else make_sdist(V1_FILES)
    index.publish("alpha", artifact, data)
    lock = _lock(tmp_path, upstream, index, artifact=artifact)
    root = tmp_path / "root"
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=lock, root=root)
    assert r.rc == 0, r.text
    assert pristine_hash(root / "alpha", tmp_path) == pypi_hash_v1()
    assert (root / "alpha/bin/run.sh").stat().st_mode & 0o777 == 0o755
    assert prelude_line.is_in_place((root / "alpha/workers/mw.py").read_bytes(), PRELUDE_LINE)
    assert index.requests == ["/simple/alpha/", f"/files/{artifact}"]
    cached = isolated_env / "pypi" / artifact
    assert cached.read_bytes() == data
    state = json.loads((root / ".sources_state.json").read_text())["alpha"]
    assert state["route"] == "pypi" and state["artifact"] == str(cached)


@pytest.mark.parametrize(
    "listed", ["served", "lock", None], ids=["index-lists-served-sha", "index-lists-lock-sha", "index-lists-no-sha"]
)
def test_sha256_mismatch_is_refused_and_nothing_is_replaced(tmp_path, upstream, index, isolated_env, listed):
    good = make_wheel(V1_FILES)
    tampered = make_wheel({**V1_FILES, "__init__.py": (b"import os; os.system('evil')\n", False)})
    lock = _lock(tmp_path, upstream, index, artifact_bytes=good)
    lock_sha = hashlib.sha256(good).hexdigest()
    index.publish("alpha", WHEEL_FILE, tampered, listed_sha256={"served": "auto", "lock": lock_sha, None: None}[listed])
    root = tmp_path / "root"
    (root / "alpha").mkdir(parents=True)
    (root / "alpha/mine.py").write_text("local work\n")
    before = snapshot(root / "alpha")
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, "--force", lock=lock, root=root)
    assert r.rc == 1
    assert "INTEGRITY ERROR" in r.text and lock_sha in r.text
    assert snapshot(root / "alpha") == before
    assert sorted(p.name for p in root.iterdir()) == [".sources_state.json", "alpha"]  # no build leftovers
    assert not (isolated_env / "pypi" / WHEEL_FILE).exists()  # a bad download is not kept

    comp = load_lock(lock).components["alpha"]
    with pytest.raises(IntegrityError, match=WHEEL_FILE):
        pypi_route.fetch_artifact(comp.pypi, isolated_env, index.simple_url)


def test_index_unreachable_falls_back_to_the_lock_url(tmp_path, upstream, index, isolated_env):
    index.publish("alpha", WHEEL_FILE, make_wheel(V1_FILES))
    lock = _lock(tmp_path, upstream, index, url=index.file_url(WHEEL_FILE))
    r = run_setup("--route", "pypi", "--index-url", dead_url(), lock=lock, root=tmp_path / "root")
    assert r.rc == 0, r.text
    assert "unreachable" in r.err and "direct URL" in r.err
    assert index.requests == [f"/files/{WHEEL_FILE}"]

    # an index that does not list the file also falls back
    (isolated_env / "pypi" / WHEEL_FILE).unlink()
    (index.base / "simple/alpha").mkdir(parents=True, exist_ok=True)
    (index.base / "simple/alpha/index.html").write_text("<html><body></body></html>")
    path, source = pypi_route.fetch_artifact(load_lock(lock).components["alpha"].pypi, isolated_env, index.simple_url)
    assert source == index.file_url(WHEEL_FILE) and path.read_bytes() == make_wheel(V1_FILES)


def test_index_unreachable_without_a_lock_url_is_reported_unavailable(tmp_path, upstream, index, isolated_env):
    lock = _lock(tmp_path, upstream, index)
    dead = dead_url()
    with pytest.raises(RouteUnavailable, match="unreachable"):
        pypi_route.fetch_artifact(load_lock(lock).components["alpha"].pypi, isolated_env, dead)
    r = run_setup("--route", "pypi", "--index-url", dead, lock=lock, root=tmp_path / "root")
    assert r.rc == 1
    assert "missing" in r.out and "unreachable" in r.out and dead in r.out
    assert not (tmp_path / "root/alpha").exists()


def test_cached_artifact_is_reused_without_network(tmp_path, upstream, index, isolated_env):
    index.publish("alpha", WHEEL_FILE, make_wheel(V1_FILES))
    lock = _lock(tmp_path, upstream, index)
    assert run_setup("--route", "pypi", "--index-url", index.simple_url, lock=lock, root=tmp_path / "r1").rc == 0
    seen = list(index.requests)
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=lock, root=tmp_path / "r2")
    assert r.rc == 0, r.text
    assert index.requests == seen  # the server got no request
    assert "(cached)" in r.err
    assert pristine_hash(tmp_path / "r2/alpha", tmp_path) == pypi_hash_v1()

    # a corrupt file in the cache is never trusted: it is fetched again
    (isolated_env / "pypi" / WHEEL_FILE).write_bytes(b"garbage")
    r = run_setup("--route", "pypi", "--index-url", index.simple_url, lock=lock, root=tmp_path / "r3")
    assert r.rc == 0, r.text
    assert len(index.requests) == len(seen) + 2


def _pypi_reachable() -> str | None:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/verl/", timeout=10) as r:
            r.read(1)
        return None
    except OSError as e:
        return f"pypi.org unreachable: {e}"


@pytest.mark.network
def test_network_real_index_verl_wheel(tmp_path, isolated_env):
    reason = _pypi_reachable()
    if reason:
        pytest.skip(reason)
    comp = load_lock(REPO_ROOT / "sources.lock").components["verl"]
    assert comp.pypi.file == "verl-0.4.0-py2.py3-none-any.whl"
    path, source = pypi_route.fetch_artifact(comp.pypi, isolated_env, "https://pypi.org/simple")
    assert source.startswith("https://") and path.parent == isolated_env / "pypi"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == comp.pypi.sha256
    dest = tmp_path / "verl"
    extract_subdir(path, comp.pypi.subdir, dest)
    assert tree_hash(dest) == reference_tree_hash(dest) == comp.tree_sha256["pypi"]
