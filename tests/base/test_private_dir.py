"""A cache folder only this account can change (verl_patches/base/private_dir.py): every level checked on the
way down, nothing followed through a link, and the descriptor handed back is the folder that was checked."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from verl_patches.base.private_dir import PrivateDirError, file_not_ours, open_private_dir, private_dir

HINT = "set XDG_CACHE_HOME to a folder only you can write"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_missing_levels_are_created_0700_and_the_descriptor_is_the_folder(tmp_path):
    root = tmp_path / "cache"
    saved = os.umask(0)
    try:
        with private_dir(root, ("a", "b"), root_hint=HINT) as (fd, path):
            assert path == tmp_path.resolve() / "cache" / "a" / "b"
            assert os.path.samestat(os.fstat(fd), path.stat())
    finally:
        os.umask(saved)
    assert [_mode(p) for p in (root, root / "a", root / "a" / "b")] == [0o700] * 3


def test_existing_private_levels_are_used_as_they_are(tmp_path):
    root = tmp_path / "cache"
    (root / "a").mkdir(parents=True, mode=0o755)
    root.chmod(0o755)
    with private_dir(root, ("a",), root_hint=HINT) as (_, path):
        assert path.name == "a" and _mode(root / "a") == 0o755  # readable by others is fine, writable is not


@pytest.mark.parametrize("mode", [0o775, 0o757, 0o1777])
@pytest.mark.parametrize("which", ["root", "below"])
def test_a_level_group_or_others_can_write_is_refused_with_the_fix(tmp_path, mode, which):
    root = tmp_path / "cache"
    (root / "a").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    target = root if which == "root" else root / "a"
    target.chmod(mode)
    with pytest.raises(PrivateDirError) as err:
        open_private_dir(root, ("a",), root_hint=HINT)
    message = str(err.value)
    sticky = ", sticky" if mode & stat.S_ISVTX else ""  # base.folder_access's words: sticky does not help here
    assert message.startswith(f"{target.resolve()}: is writable by group/others (mode {mode:o}{sticky}); ")
    assert f"`chmod go-w {target.resolve()}`" in message and HINT in message and "\n" not in message


def test_a_level_owned_by_another_account_is_refused(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    real = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: real + 4242)
    with pytest.raises(PrivateDirError, match=rf"cache: is owned by uid {real}, not by this account"):
        open_private_dir(root, (), root_hint=HINT)


def test_an_ancestor_others_can_write_is_refused_unless_sticky(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(PrivateDirError, match=r"shared: is writable by group/others and not sticky \(mode 777\)"):
        open_private_dir(shared / "cache", (), root_hint=HINT)
    shared.chmod(0o1777)  # /tmp: the others cannot rename what is ours
    with private_dir(shared / "cache", (), root_hint=HINT) as (_, path):
        assert path == shared.resolve() / "cache"


def test_an_ancestor_of_another_non_root_account_is_refused(tmp_path, monkeypatch):
    parent = tmp_path / "theirs"
    parent.mkdir()
    real = os.geteuid()
    if real == 0:
        # owned by root counts as safe, so the test makes this account someone else and the folder root's-not
        monkeypatch.setattr(os, "geteuid", lambda: 4242)
        os.chown(parent, 4343, -1)
    else:
        pytest.skip("needs root to give a folder to another account")
    with pytest.raises(PrivateDirError, match="theirs: is owned by uid 4343 .*who can rename"):
        open_private_dir(parent / "cache", (), root_hint=HINT)


def test_links_in_the_roots_spelling_are_resolved_but_a_link_below_is_refused(tmp_path):
    real = tmp_path / "disk" / "cache"
    real.mkdir(parents=True, mode=0o700)
    (tmp_path / "disk").chmod(0o755)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".cache").symlink_to(real)
    with private_dir(tmp_path / "home" / ".cache", ("x",), root_hint=HINT) as (_, path):
        assert path == real.resolve() / "x"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (real / "y").symlink_to(elsewhere)
    with pytest.raises(PrivateDirError, match=r"/y: is a symbolic link; a cache folder is never followed through"):
        open_private_dir(real, ("y",), root_hint=HINT)


def test_a_file_where_a_folder_belongs_is_refused(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    (root / "a").write_text("")
    with pytest.raises(PrivateDirError, match=r"/a: cannot be opened \(Not a directory\)"):
        open_private_dir(root, ("a",), root_hint=HINT)


def test_a_level_that_cannot_be_created_is_one_line(tmp_path, monkeypatch):
    parent = tmp_path / "ro"
    parent.mkdir(mode=0o555)

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "mkdir", refuse)  # root ignores the mode bits, so the refusal is played
    with pytest.raises(PrivateDirError, match=r"ro/cache: cannot be created \(Permission denied\)"):
        open_private_dir(parent / "cache", (), root_hint=HINT)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "a\0"])
def test_below_takes_single_names_only(tmp_path, name):
    with pytest.raises(ValueError, match="is not one folder name"):
        open_private_dir(tmp_path, (name,), root_hint=HINT)


def test_file_not_ours_names_what_is_wrong(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    f.chmod(0o644)
    assert file_not_ours(f.stat()) is None
    f.chmod(0o664)
    assert file_not_ours(f.stat()) == "is writable by group/others (mode 664)"
    assert file_not_ours(f.stat(), uid=os.geteuid() + 1).startswith("is owned by uid ")
    assert file_not_ours(tmp_path.stat()) == "is not a regular file"


def test_a_hint_written_with_its_own_or_reads_once(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o775)
    root.chmod(0o775)
    with pytest.raises(PrivateDirError) as err:
        open_private_dir(root, (), root_hint="or set X to a folder only you can write")
    assert str(err.value).endswith(f"`chmod go-w {root.resolve()}`, or set X to a folder only you can write")


@pytest.mark.parametrize("above", [0o755, 0o775, 0o777, 0o1777, 0o1775])
@pytest.mark.parametrize("own", [0o700, 0o755, 0o770, 0o1777])
def test_the_walk_and_the_path_check_judge_a_folder_alike(tmp_path, above, own):
    """One home for the rule (base.folder_access): the cache walk refuses exactly what the checkpoint root's
    path check names, with the same words, whatever the modes of the folder and the level above it."""
    from verl_patches.base.folder_access import access_problem

    tmp_path.chmod(0o700)
    parent = tmp_path / "parent"
    (parent / "cache").mkdir(parents=True)
    (parent / "cache").chmod(own)
    parent.chmod(above)
    problem = access_problem(parent / "cache", private=True)
    if problem is None:
        with private_dir(parent / "cache", (), root_hint=HINT) as (_, path):
            assert path == (parent / "cache").resolve()
        return
    with pytest.raises(PrivateDirError) as err:
        open_private_dir(parent / "cache", (), root_hint=HINT)
    folder, why = problem.split(": ", 1)
    assert str(err.value).startswith(f"{folder}: is {why}; ")
