"""verl_patches/base/folder_access.py: who besides this account can change what lies at a folder's path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from verl_patches.base.folder_access import access_problem

OTHER_UID = 4242  # an account that is neither root nor this one (files are given to it with chown, as root)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another account needs root")


@pytest.fixture
def base(tmp_path: Path) -> Path:
    """A folder only this account can change (pytest's own are 0700 under a sticky /tmp)."""
    tmp_path.chmod(0o700)
    assert access_problem(tmp_path, private=True) is None
    return tmp_path


def folder(parent: Path, name: str, mode: int) -> Path:
    p = parent / name
    p.mkdir()
    p.chmod(mode)
    return p


@pytest.mark.parametrize("mode", [0o700, 0o750, 0o755, 0o711])
def test_a_folder_only_we_can_write_passes(base: Path, mode: int) -> None:
    assert access_problem(folder(base, "ckpt", mode), private=True) is None


@pytest.mark.parametrize(
    "mode,needle",
    [
        (0o770, "writable by group/others (mode 770)"),
        (0o775, "writable by group/others (mode 775)"),
        (0o777, "writable by group/others (mode 777)"),
        (0o1777, "writable by group/others (mode 1777, sticky)"),
        (0o1770, "writable by group/others (mode 1770, sticky)"),
        (0o757, "writable by group/others (mode 757)"),
    ],
)
def test_a_private_folder_others_can_write_is_named_sticky_or_not(base: Path, mode: int, needle: str) -> None:
    ck = folder(base, "ckpt", mode)
    assert access_problem(ck, private=True) == f"{ck}: {needle}"


@pytest.mark.parametrize("mode", [0o775, 0o777, 0o757])
def test_a_level_above_that_others_can_write_without_the_sticky_bit_is_named(base: Path, mode: int) -> None:
    shared = folder(base, "shared", mode)
    ck = folder(shared, "ckpt", 0o700)
    problem = access_problem(ck, private=True)
    assert problem is not None and problem.startswith(f"{shared}: writable by group/others and not sticky")
    assert "they can rename 'ckpt'" in problem


def test_a_sticky_level_above_is_fine_when_the_entry_is_ours(base: Path) -> None:
    tmp = folder(base, "tmp", 0o1777)  # like /tmp
    assert access_problem(folder(tmp, "ckpt", 0o700), private=True) is None
    assert access_problem(tmp, private=False) is None  # a log root in which each launch makes its own folder


@needs_root
def test_a_sticky_level_whose_entry_another_account_owns_is_named(base: Path) -> None:
    tmp = folder(base, "tmp", 0o1777)
    theirs = folder(tmp, "team", 0o755)
    os.chown(theirs, OTHER_UID, -1)
    ck = folder(theirs, "ckpt", 0o700)
    problem = access_problem(ck, private=True)
    assert problem is not None and "owned by uid 4242" in problem and str(theirs) in problem


@needs_root
def test_a_level_or_the_folder_owned_by_another_account_is_named(base: Path) -> None:
    team = folder(base, "team", 0o755)
    os.chown(team, OTHER_UID, -1)
    ck = folder(team, "ckpt", 0o700)
    assert access_problem(ck, private=True) == (
        f"{team}: owned by uid 4242 (neither root nor this account), who can rename 'ckpt' in it"
    )
    mine = folder(base, "mine", 0o700)
    os.chown(mine, OTHER_UID, -1)
    assert access_problem(mine, private=True) == f"{mine}: owned by uid 4242, not by this account (uid 0)"
    assert "who can replace what is in it" in access_problem(mine, private=False)


def test_a_link_in_the_spelling_is_judged_where_it_lives_and_where_it_leads(base: Path) -> None:
    real = folder(base, "real", 0o700)
    shared = folder(base, "shared", 0o777)
    (shared / "ck").symlink_to(real)  # anyone can retarget this link
    problem = access_problem(shared / "ck", private=True)
    assert problem is not None and problem.startswith(f"{shared}: writable by group/others and not sticky")
    (base / "ck").symlink_to(real)
    assert access_problem(base / "ck", private=True) is None
    (base / "open").symlink_to(shared)
    problem = access_problem(base / "open", private=True)
    assert problem == f"{shared}: writable by group/others (mode 777)"


def test_a_log_root_is_judged_as_a_level_above(base: Path) -> None:
    assert access_problem(folder(base, "logs", 0o755), private=False) is None
    logs = folder(base, "logs2", 0o775)
    assert access_problem(logs, private=False) == (
        f"{logs}: writable by group/others and not sticky (mode 775): they can replace what is in it"
    )


def test_not_a_folder_and_missing(base: Path) -> None:
    (base / "f").write_text("x")
    assert access_problem(base / "f", private=True) == f"{base / 'f'}: not a folder"
    with pytest.raises(FileNotFoundError):
        access_problem(base / "nope", private=True)
