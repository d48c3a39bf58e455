"""Guarantees of setup: never half-written, local edits kept unless --force, no-op re-runs, clear partial status."""

from __future__ import annotations

import os
import pathlib

import pytest

from sources_testlib import (
    V1_FILES,
    alpha_lock,
    beta_component,
    run_setup,
    snapshot,
)
from verl_patches.sources import install
from verl_patches.sources.lock import load_lock


def _unreachable(tmp_path, name, needed_on):
    return {
        "package": name,
        "git_urls": [str(tmp_path / f"{name}-gone.git")],
        "ref": "refs/tags/v1",
        "commit": "c" * 40,
        "git_subdir": name,
        "needed_on": needed_on,
        "tree_sha256": {"git": "d" * 64},
    }


# --------------------------------------------------------------------------- failed or interrupted runs


def test_failure_at_the_hash_check_leaves_the_folder_untouched(installed, tmp_path, upstream):
    _, root = installed
    (root / "alpha/data/table.txt").write_bytes(b"local\n")  # so --force is needed to replace it at all
    before = snapshot(root / "alpha")
    # the lock now pins v2, but with a tree hash that v2 does not have
    bad = alpha_lock(tmp_path, upstream, name="bad.lock", commit=upstream.v2, ref="refs/tags/v2.0")
    text = bad.read_text().replace(upstream.git_hash_v1, "f" * 64)
    bad.write_text(text)
    r = run_setup("--route", "git", "--force", lock=bad, root=root)
    assert r.rc == 1
    assert "tree hash" in r.text and "f" * 64 in r.text
    assert "changed: data/table.txt" in r.text and "added: new.py" in r.text  # v2 vs the v1 manifest
    assert snapshot(root / "alpha") == before
    assert not (root / ".sources_build").exists()


def test_crash_between_the_two_renames_is_recovered_by_the_next_run(installed, tmp_path, monkeypatch):
    lock, root = installed
    original = {
        p.relative_to(root / "alpha").as_posix(): (p.lstat().st_ino, p.read_bytes() if p.is_file() else None)
        for p in (root / "alpha").rglob("*")
    }
    real_rename = os.rename

    def crashing_rename(src, dst, *args, **kwargs):  # the renames of base.atomic_write.swap_folder_in
        src = pathlib.Path(src)
        if src.parent.name == ".sources_build" and ".old." not in src.name:
            raise KeyboardInterrupt("simulated crash after the old folder was moved aside")
        return real_rename(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", crashing_rename)
    opts = install.SetupOptions(
        root=root, lock=load_lock(lock), cache=tmp_path / "user-cache", routes=["git"], force=True
    )
    with pytest.raises(KeyboardInterrupt):
        install.setup(opts)
    monkeypatch.undo()
    assert not (root / "alpha").exists()  # the crash left the folder moved aside
    assert len(list((root / ".sources_build").glob("alpha.old.*"))) == 1

    r = run_setup("--route", "git", "--offline", lock=lock, root=root, env={"VERL_OVERLAY_CACHE": "/nonexistent"})
    assert r.rc == 0, r.text
    assert "restored alpha/" in r.err and "unchanged" in r.out
    restored = {
        p.relative_to(root / "alpha").as_posix(): (p.lstat().st_ino, p.read_bytes() if p.is_file() else None)
        for p in (root / "alpha").rglob("*")
    }
    assert restored == original  # the very same files (same inodes), not a re-download
    assert not (root / ".sources_build").exists()


# --------------------------------------------------------------------------- local edits


def test_local_edits_are_listed_and_kept_without_force(installed, tmp_path):
    lock, root = installed
    (root / "alpha/data/table.txt").write_bytes(b"my change\n")
    (root / "alpha/mine.py").write_bytes(b"x = 1\n")
    (root / "alpha/bin/run.sh").unlink()
    before = snapshot(root / "alpha")
    r = run_setup("--route", "git", lock=lock, root=root)
    assert r.rc == 1
    for line in ("changed: alpha/data/table.txt", "added: alpha/mine.py", "removed: alpha/bin/run.sh", "--force"):
        assert line in r.text, line
    assert snapshot(root / "alpha") == before

    r = run_setup("--route", "git", "--force", lock=lock, root=root)
    assert r.rc == 0, r.text
    assert (root / "alpha/data/table.txt").read_bytes() == V1_FILES["data/table.txt"][0]
    assert not (root / "alpha/mine.py").exists() and (root / "alpha/bin/run.sh").exists()
    assert run_setup("--verify", lock=lock, root=root).rc == 0


def test_an_edit_next_to_the_prelude_line_is_a_local_edit(installed):
    lock, root = installed
    mw = root / "alpha/workers/mw.py"
    mw.write_bytes(mw.read_bytes() + b"# my note\n")
    r = run_setup("--route", "git", lock=lock, root=root)
    assert r.rc == 1 and "changed: alpha/workers/mw.py" in r.text
    assert mw.read_bytes().endswith(b"# my note\n")


# --------------------------------------------------------------------------- no-op re-run


def test_second_run_on_a_good_tree_touches_nothing_and_needs_no_network(tmp_path, upstream, index):
    beta = beta_component(index, tmp_path / "no-such.git")
    lock = alpha_lock(tmp_path, upstream, extra={"beta": beta})
    root = tmp_path / "root"
    r = run_setup("--index-url", index.simple_url, lock=lock, root=root)
    assert r.rc == 0, r.text
    assert (root / ".sources_state.json").is_file()
    before = snapshot(root)
    index.stop()
    upstream.bare.rename(tmp_path / "gone.git")
    r = run_setup(lock=lock, root=root)
    assert r.rc == 0, r.text
    assert r.out.count("unchanged") == 2 and "setup: COMPLETE" in r.out
    assert snapshot(root) == before
    assert run_setup("--verify", lock=lock, root=root).rc == 0
    assert snapshot(root) == before


# --------------------------------------------------------------------------- unreachable components


@pytest.mark.parametrize(
    "needed_on, device, rc, summary",
    [
        (["npu"], "cpu", 3, "COMPLETE EXCEPT OPTIONAL-HERE"),
        (["npu", "cpu"], "cpu", 1, "INCOMPLETE"),
        (["npu"], "npu", 1, "INCOMPLETE"),
    ],
)
def test_unreachable_component_status(tmp_path, upstream, needed_on, device, rc, summary):
    lock = alpha_lock(tmp_path, upstream, extra={"gamma": _unreachable(tmp_path, "gamma", needed_on)})
    root = tmp_path / "root"
    env = {"VERL_PATCHES_DEVICE": device}
    r = run_setup("--route", "git", lock=lock, root=root, env=env)
    assert r.rc == rc, r.text
    assert f"setup: {summary}" in r.out
    gamma_lines = [ln for ln in r.out.splitlines() if "gamma" in ln]
    assert gamma_lines and "missing" in gamma_lines[0]
    assert ("optional on this host" in gamma_lines[0]) == (rc == 3)
    assert str(tmp_path / "gamma-gone.git") in r.out and "unreachable" in r.out  # the reason
    assert (root / "alpha").is_dir() and not (root / "gamma").exists()  # the rest is set up
    v = run_setup("--verify", lock=lock, root=root, env=env)
    assert v.rc == rc and "MISSING" in v.out


def test_only_restricts_the_work(tmp_path, upstream):
    gamma = _unreachable(tmp_path, "gamma", ["cpu"])
    lock = alpha_lock(tmp_path, upstream, extra={"gamma": gamma})
    root = tmp_path / "root"
    (root / "gamma").mkdir(parents=True)
    (root / "gamma/edited.py").write_text("not ours to touch\n")
    before = snapshot(root / "gamma")
    r = run_setup("--route", "git", "--only", "alpha", lock=lock, root=root)
    assert r.rc == 0, r.text
    assert "gamma" not in r.text
    assert (root / "alpha").is_dir() and snapshot(root / "gamma") == before
    assert run_setup("--verify", "--only", "alpha", lock=lock, root=root).rc == 0
    assert run_setup("--verify", lock=lock, root=root).rc == 1  # gamma differs, when asked about
