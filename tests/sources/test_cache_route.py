"""The cache route: export on a connected machine, install offline elsewhere; tampering is refused."""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from sources_testlib import (
    V1_FILES,
    alpha_component,
    beta_component,
    dead_url,
    make_wheel,
    run_setup,
    sha256_bytes,
    write_alpha_manifests,
    write_lock,
)


@pytest.fixture
def exported(tmp_path, upstream, index):
    """A lock with a git component (alpha) and a PyPI one (beta), exported into a cache dir, then every
    network source made unreachable."""
    alpha = alpha_component(upstream)
    beta = beta_component(index, tmp_path / "no-such.git")
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": alpha, "beta": beta})
    # per-file records beside the lock, as committed for the real lock, so errors can name files
    write_alpha_manifests(lock)
    cache_dir = tmp_path / "export"
    r = run_setup("--export-cache", cache_dir, "--index-url", index.simple_url, lock=lock, root=tmp_path / "unused")
    assert r.rc == 0, r.text
    assert "exported 2 component(s)" in r.out
    index.stop()
    upstream.bare.rename(tmp_path / "gone.git")
    return lock, cache_dir, {"VERL_OVERLAY_CACHE": str(tmp_path / "fresh-user-cache"), "PIP_INDEX_URL": dead_url()}


def _install(lock, cache_dir, root, env):
    return run_setup("--route", "cache", "--cache", cache_dir, "--offline", lock=lock, root=root, env=env)


def test_export_layout(exported, upstream):
    _, cache_dir, _ = exported
    index = json.loads((cache_dir / "sources-cache.json").read_text())
    assert index["schema"] == 1
    alpha, beta = index["components"]["alpha"], index["components"]["beta"]
    assert alpha["route"] == "git" and alpha["commit"] == upstream.v1 and (cache_dir / alpha["file"]).is_file()
    assert beta["route"] == "pypi" and beta["file"] == "beta-1.0-py3-none-any.whl"
    assert (cache_dir / beta["file"]).read_bytes() == make_wheel(V1_FILES, package="beta")
    assert sorted(p.name for p in cache_dir.iterdir()) == sorted(["sources-cache.json", alpha["file"], beta["file"]])


def test_offline_install_from_the_exported_cache(exported, tmp_path, upstream):
    lock, cache_dir, env = exported
    root = tmp_path / "airgapped"
    r = _install(lock, cache_dir, root, env)
    assert r.rc == 0, r.text
    assert "setup: COMPLETE" in r.out
    assert (root / "alpha/data/table.txt").read_bytes() == V1_FILES["data/table.txt"][0]
    assert (root / "alpha/bin/run.sh").stat().st_mode & 0o777 == 0o755
    assert (root / "alpha/link.txt").is_symlink()
    state = json.loads((root / ".sources_state.json").read_text())
    assert state["alpha"]["route"] == "cache" and state["alpha"]["origin_route"] == "git"
    assert state["beta"]["route"] == "cache" and state["beta"]["origin_route"] == "pypi"
    assert run_setup("--verify", lock=lock, root=root, env=env).rc == 0
    # nothing was written to the user download cache: everything came from the export
    assert not (tmp_path / "fresh-user-cache").exists()


def test_tampered_pypi_artifact_is_refused(exported, tmp_path):
    lock, cache_dir, env = exported
    wheel = cache_dir / "beta-1.0-py3-none-any.whl"
    wheel.write_bytes(make_wheel({**V1_FILES, "__init__.py": (b"evil = 1\n", False)}, package="beta"))
    root = tmp_path / "airgapped"
    r = _install(lock, cache_dir, root, env)
    assert r.rc == 1
    assert "INTEGRITY ERROR" in r.text and "sha256" in r.text and wheel.name in r.text
    assert not (root / "beta").exists()
    assert (root / "alpha").is_dir()  # the rest is still set up


def _tamper_alpha_tar(cache_dir):
    entry = json.loads((cache_dir / "sources-cache.json").read_text())["components"]["alpha"]
    tar_path = cache_dir / entry["file"]
    with tarfile.open(tar_path) as t:
        members = [(m, t.extractfile(m).read() if m.isfile() else None) for m in t.getmembers()]
    with tarfile.open(tar_path, "w") as t:
        for m, data in members:
            if m.name.endswith("data/table.txt"):
                data = b"tampered\n"
                m.size = len(data)
            t.addfile(m, io.BytesIO(data) if data is not None else None)
    return tar_path


def test_tampered_git_tar_is_refused_by_the_recorded_sha256_before_unpacking(exported, tmp_path):
    lock, cache_dir, env = exported
    tar_path = _tamper_alpha_tar(cache_dir)
    root = tmp_path / "airgapped"
    r = _install(lock, cache_dir, root, env)
    assert r.rc == 1
    assert "INTEGRITY ERROR" in r.text and f"{tar_path}: sha256" in r.text and "sources-cache.json" in r.text
    assert "unpacking " + tar_path.name not in r.text  # refused before extraction
    assert not (root / "alpha").exists()


def test_tampered_git_tree_with_a_rewritten_index_is_refused_naming_the_file(exported, tmp_path):
    lock, cache_dir, env = exported
    tar_path = _tamper_alpha_tar(cache_dir)
    index = cache_dir / "sources-cache.json"
    data = json.loads(index.read_text())
    data["components"]["alpha"]["sha256"] = sha256_bytes(tar_path.read_bytes())  # the attacker fixes the index
    index.write_text(json.dumps(data))
    root = tmp_path / "airgapped"
    r = _install(lock, cache_dir, root, env)
    assert r.rc == 1
    assert "tree hash" in r.text and "changed: data/table.txt" in r.text
    assert not (root / "alpha").exists()


def test_cache_manifest_commit_mismatch_is_refused(exported, tmp_path, upstream):
    lock, cache_dir, env = exported
    p = cache_dir / "sources-cache.json"
    data = json.loads(p.read_text())
    data["components"]["alpha"]["commit"] = upstream.v2
    p.write_text(json.dumps(data))
    r = _install(lock, cache_dir, tmp_path / "airgapped", env)
    assert r.rc == 1
    assert "INTEGRITY ERROR" in r.text and upstream.v2 in r.text and upstream.v1 in r.text


def test_cache_dir_without_an_index_is_reported(tmp_path, upstream):
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": alpha_component(upstream)})
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_setup("--route", "cache", "--cache", empty, "--offline", lock=lock, root=tmp_path / "root")
    assert r.rc == 1 and "sources-cache.json" in r.out and "--export-cache" in r.out
