"""The git route against local bare repositories: exact commit, moved tags, wrong commits, mirror fallback."""

from __future__ import annotations

import json
import os
import shutil
import stat

import pytest

from sources_testlib import (
    PRELUDE_LINE,
    V1_FILES,
    V2_FILES,
    WHEEL_FILE,
    alpha_component,
    dead_url,
    git,
    make_wheel,
    pristine_hash,
    pypi_hash_v1,
    reference_tree_hash,
    run_setup,
    write_lock,
)
from verl_patches.sources import git_route, install, prelude_line
from verl_patches.sources.errors import IntegrityError, RouteUnavailable
from verl_patches.sources.lock import load_lock


def _lock(tmp_path, up, **kw):
    return write_lock(tmp_path / "lock" / "sources.lock", {"alpha": alpha_component(up, **kw)})


@pytest.mark.parametrize("ref", ["refs/tags/v1.0", "refs/tags/v1.0-light"], ids=["annotated", "lightweight"])
def test_tag_installs_the_exact_commit(tmp_path, upstream, ref):
    root = tmp_path / "root"
    r = run_setup("--route", "git", lock=_lock(tmp_path, upstream, ref=ref), root=root)
    assert r.rc == 0, r.text
    assert "setup: COMPLETE" in r.out
    folder = root / "alpha"
    # v1 content, although the branch head (v2) changed data/table.txt and added new.py
    assert (folder / "data/table.txt").read_bytes() == V1_FILES["data/table.txt"][0]
    assert not (folder / "new.py").exists()
    assert pristine_hash(folder, tmp_path) == upstream.git_hash_v1
    # modes and links exported as git stores them
    assert os.stat(folder / "bin/run.sh").st_mode & 0o777 == 0o755
    assert os.stat(folder / "data/table.txt").st_mode & 0o777 == 0o644
    assert os.readlink(folder / "link.txt") == "data/table.txt"
    # the prelude line went in, by parsing, once
    mw = (folder / "workers/mw.py").read_bytes()
    assert prelude_line.find(mw, PRELUDE_LINE) == [6] and prelude_line.is_in_place(mw, PRELUDE_LINE)
    state = json.loads((root / ".sources_state.json").read_text())["alpha"]
    assert state["route"] == "git" and state["commit"] == upstream.v1 and state["source"] == upstream.url
    assert not (root / ".sources_build").exists()


def test_resolve_ref_peels_annotated_tags(upstream):
    assert git_route.resolve_ref(upstream.url, "refs/tags/v1.0") == upstream.v1
    assert git_route.resolve_ref(upstream.url, "refs/tags/v1.0-light") == upstream.v1
    assert git_route.resolve_ref(upstream.url, "refs/tags/v2.0") == upstream.v2
    assert git_route.resolve_ref(upstream.url, "refs/tags/absent") is None


def test_moved_tag_is_refused_naming_ref_and_both_commits(tmp_path, upstream, isolated_env):
    lock = _lock(tmp_path, upstream)
    upstream.move_tag("v1.0", upstream.v2)
    comp = load_lock(lock).components["alpha"]
    with pytest.raises(IntegrityError) as e:
        git_route.fetch_commit(comp, isolated_env, [upstream.url])
    for part in ("refs/tags/v1.0", upstream.v1, upstream.v2, upstream.url):
        assert part in str(e.value)
    root = tmp_path / "root"
    r = run_setup("--route", "git", lock=lock, root=root)
    assert r.rc == 1
    assert "INTEGRITY ERROR" in r.text and upstream.v1 in r.text and upstream.v2 in r.text
    assert not (root / "alpha").exists()


def test_lock_commit_absent_on_the_remote(tmp_path, upstream, isolated_env):
    absent = "1234567890abcdef1234567890abcdef12345678"
    comp = load_lock(_lock(tmp_path, upstream, commit=absent)).components["alpha"]
    with pytest.raises(IntegrityError) as e:
        git_route.fetch_commit(comp, isolated_env, [upstream.url])
    assert absent in str(e.value) and upstream.v1 in str(e.value)
    assert not git_route.has_commit(git_route.cache_git_dir(isolated_env, comp), absent)
    # a ref the remote does not have at all
    comp = load_lock(_lock(tmp_path, upstream, ref="refs/tags/v9.9")).components["alpha"]
    with pytest.raises(RouteUnavailable, match="has no ref refs/tags/v9.9"):
        git_route.fetch_commit(comp, isolated_env, [upstream.url])
    r = run_setup("--route", "git", lock=_lock(tmp_path, upstream, commit=absent), root=tmp_path / "root")
    assert r.rc == 1 and absent in r.text
    assert not (tmp_path / "root/alpha").exists()


def test_unreachable_mirrors_then_a_working_one(tmp_path, upstream, isolated_env):
    bad_path = str(tmp_path / "no-such-repo.git")
    bad_http = dead_url().replace("/simple", "/repo.git")
    lock = _lock(tmp_path, upstream, git_urls=[bad_path, bad_http, upstream.url])
    comp = load_lock(lock).components["alpha"]
    fetched = git_route.fetch_commit(comp, isolated_env, list(comp.git_urls))
    assert fetched.url == upstream.url
    assert [a.split(": ")[0] for a in fetched.attempts] == [bad_path, bad_http]
    assert all("unreachable" in a for a in fetched.attempts)

    shutil.rmtree(isolated_env)  # again from scratch, end to end: the attempts are reported
    r = run_setup("--route", "git", lock=lock, root=tmp_path / "root")
    assert r.rc == 0, r.text
    assert bad_path in r.err and bad_http in r.err and f"fetched from {upstream.url}" in r.err


def test_all_mirrors_unreachable_is_reported_with_each_reason(tmp_path, upstream):
    bad_path = str(tmp_path / "no-such-repo.git")
    lock = _lock(tmp_path, upstream, git_urls=[bad_path])
    r = run_setup("--route", "git", lock=lock, root=tmp_path / "root")
    assert r.rc == 1
    assert "alpha" in r.out and "missing" in r.out and bad_path in r.out and "unreachable" in r.out
    assert "INCOMPLETE" in r.out


def test_mirror_overrides_by_flag_and_environment(tmp_path, upstream):
    bad_path = str(tmp_path / "no-such-repo.git")
    lock = _lock(tmp_path, upstream, git_urls=[bad_path])
    r = run_setup("--route", "git", "--mirror", f"alpha={upstream.url}", lock=lock, root=tmp_path / "r1")
    assert r.rc == 0, r.text
    assert bad_path not in r.err  # the override is tried first and works

    shutil.rmtree(tmp_path / "user-cache")
    r = run_setup(
        "--route",
        "git",
        lock=lock,
        root=tmp_path / "r2",
        env={"VERL_OVERLAY_GIT_MIRROR_ALPHA": f"{bad_path}2,{upstream.url}"},
    )
    assert r.rc == 0, r.text
    assert f"{bad_path}2" in r.err

    opts = install.SetupOptions(
        root=tmp_path,
        lock=load_lock(lock),
        cache=tmp_path,
        routes=["git"],
        mirrors={"alpha": ["https://flag.example/alpha.git"]},
    )
    os.environ["VERL_OVERLAY_GIT_MIRROR_ALPHA"] = "git@env.example:alpha.git"
    try:
        assert install.git_urls(opts, load_lock(lock).components["alpha"]) == [
            "git@env.example:alpha.git",
            "https://flag.example/alpha.git",
            bad_path,
        ]
    finally:
        del os.environ["VERL_OVERLAY_GIT_MIRROR_ALPHA"]


def test_second_install_comes_from_the_git_cache_without_network(tmp_path, upstream):
    lock = _lock(tmp_path, upstream)
    assert run_setup("--route", "git", lock=lock, root=tmp_path / "r1").rc == 0
    upstream.bare.rename(tmp_path / "gone.git")
    r = run_setup("--route", "git", "--offline", lock=lock, root=tmp_path / "r2")
    assert r.rc == 0, r.text
    assert "(git cache)" in r.err
    assert pristine_hash(tmp_path / "r2/alpha", tmp_path) == upstream.git_hash_v1


def test_export_tree_writes_modes_links_and_only_the_subdir(tmp_path, upstream, isolated_env):
    comp = load_lock(_lock(tmp_path, upstream, commit=upstream.v2, ref="refs/tags/v2.0")).components["alpha"]
    comp = type(comp)(**{**comp.__dict__, "tree_sha256": {"git": upstream.git_hash_v2}})
    fetched = git_route.fetch_commit(comp, isolated_env, [upstream.url])
    dest = tmp_path / "out"
    n = git_route.export_tree(fetched.git_dir, upstream.v2, "alpha", dest)
    assert n == len(V2_FILES) + 1
    assert reference_tree_hash(dest) == upstream.git_hash_v2
    assert stat.S_ISLNK(os.lstat(dest / "link.txt").st_mode)
    assert os.stat(dest / "bin/run.sh").st_mode & 0o777 == 0o755
    assert not (dest / "README.md").exists()
    assert git("cat-file", "-t", upstream.v2, cwd=upstream.work) == "commit"


def test_relock_measures_the_tree_hashes_and_writes_manifests(tmp_path, upstream, index):
    index.publish("alpha", WHEEL_FILE, make_wheel(V1_FILES))
    comp = alpha_component(upstream, index)
    comp["tree_sha256"] = {"git": "", "pypi": ""}  # a fresh pin: hashes not measured yet
    lock = write_lock(tmp_path / "lock" / "sources.lock", {"alpha": comp})
    r = run_setup("--relock", "--index-url", index.simple_url, lock=lock, root=tmp_path / "root")
    assert r.rc == 0, r.text
    assert load_lock(lock).components["alpha"].tree_sha256 == {"git": upstream.git_hash_v1, "pypi": pypi_hash_v1()}
    assert "# test lock" in lock.read_text()
    for route, expected in (("git", upstream.git_hash_v1), ("pypi", pypi_hash_v1())):
        body = json.loads((lock.parent / "sources.manifests" / f"alpha.{route}.json").read_text())
        assert body["tree_sha256"] == expected and "workers/mw.py" in body["files"]
    assert not (tmp_path / "root").exists()  # relock installs nothing
    # the relocked lock installs
    assert run_setup("--route", "git", lock=lock, root=tmp_path / "root").rc == 0
