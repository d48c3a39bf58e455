"""Shared checkpoint folders (issue 41, class 4): the run's identity is a secret only the job's account can read,
every step manifest is signed with it, and a checkpoint root others can change is refused on the cluster unless
the user accepts the risk by name. The attacks are another account's: a step of its own copied into our root
(with its own weights, its digests resealed), our marker copied into a planted folder, a secret file planted
before our first save, and a root or a level above it that others can write into."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from reseal import reseal_signed, reseal_unsigned
from test_safe_load import committed_actor
from verl_patches.base.env_flags import EnvError
from verl_patches.checkpoint import commit, committed_role, run_identity, trainer_io
from verl_patches.checkpoint.manifest import CheckpointIncomplete
from verl_patches.checkpoint.root_access import (
    ALLOW_SHARED_ROOT_ENV,
    CheckpointRootError,
    check_root_access,
    cluster_run,
    root_verdict,
)

OTHER_UID = 4242
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another account needs root")


def mode_of(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


# --- the secret ----------------------------------------------------------------------------------------------------


def test_the_first_save_writes_a_secret_only_this_account_can_read_and_keeps_it(tmp_path: Path) -> None:
    saved = os.umask(0)  # the loosest umask: the secret is 0600 anyway, from its first byte
    try:
        committed_actor(tmp_path)
    finally:
        os.umask(saved)
    secret_file = tmp_path / run_identity.SECRET_FILE
    st = secret_file.lstat()
    assert stat.S_ISREG(st.st_mode) and mode_of(secret_file) == 0o600 and st.st_uid == os.geteuid()
    text = secret_file.read_text()
    assert len(text) == 65 and int(text, 16) >= 0
    secret = run_identity.read_run_secret(tmp_path)
    assert run_identity.ensure_run_secret(tmp_path) == secret  # a restart of the same run: the same identity
    committed_actor(tmp_path / "second")
    assert run_identity.read_run_secret(tmp_path / "second") != secret  # another run: another identity
    # a copy of a step folder does not carry it: it lives beside the steps, never inside one
    step = tmp_path / "global_step_3"
    assert all(text.strip() not in p.read_bytes().decode("latin-1") for p in step.rglob("*") if p.is_file())
    # what marks our folders is derived from it and unreadable to others too
    marker = step / commit.OWNER_FILE
    assert mode_of(marker) == 0o600 and marker.read_text().strip() == run_identity.FolderTags.of(secret).owner
    assert mode_of(step) & 0o022 == 0 and mode_of(tmp_path / "second") & 0o022 == 0


def test_an_existing_secret_is_never_replaced_by_a_concurrent_first_save(tmp_path: Path, monkeypatch) -> None:
    first = tmp_path / run_identity.SECRET_FILE
    real = run_identity.read_run_secret
    calls = []

    def none_then_planted(root):
        calls.append(root)
        if len(calls) == 1:  # another save creates it between our look and our write
            fd = os.open(first, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, b"ab" * 32 + b"\n")
            os.close(fd)
            return None
        return real(root)

    monkeypatch.setattr(run_identity, "read_run_secret", none_then_planted)
    assert run_identity.ensure_run_secret(tmp_path) == bytes.fromhex("ab" * 32)
    assert first.read_bytes() == b"ab" * 32 + b"\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [run_identity.SECRET_FILE]  # no temp left behind


def _plant(root: Path, how: str) -> str:
    root.mkdir(parents=True, exist_ok=True)
    path = root / run_identity.SECRET_FILE
    if how == "link":
        (root / "elsewhere").write_text("ab" * 32 + "\n")
        path.symlink_to(root / "elsewhere")
        return "is a symbolic link"
    if how == "readable":
        path.write_text("ab" * 32 + "\n")
        path.chmod(0o644)
        return "readable or writable by group/others (mode 644)"
    if how == "malformed":
        path.write_text("hunter2\n")
        path.chmod(0o600)
        return "not a run secret (64 hex digits)"
    if how == "folder":
        path.mkdir()
        return "not a regular file"
    assert how == "theirs"
    path.write_text("ab" * 32 + "\n")
    path.chmod(0o600)
    os.chown(path, OTHER_UID, -1)
    return "owned by uid 4242, not by this account"


HOW = ["link", "readable", "malformed", "folder", pytest.param("theirs", marks=needs_root)]


@pytest.mark.parametrize("how", HOW)
def test_a_planted_or_exposed_secret_is_never_used_and_named(tmp_path: Path, how: str) -> None:
    needle = _plant(tmp_path, how)
    with pytest.raises(run_identity.RunSecretError, match=re.escape(needle)) as e:
        run_identity.read_run_secret(tmp_path)
    assert str(e.value).startswith(f"{tmp_path / run_identity.SECRET_FILE}: ") and "\n" not in str(e.value)
    with pytest.raises(CheckpointRootError, match=re.escape(needle)):  # the save refuses to sign with it
        commit.begin_step(tmp_path, 1)
    assert not any(p.name.startswith(".staging") for p in tmp_path.iterdir())


@pytest.mark.parametrize("how", HOW)
def test_steps_of_a_root_whose_secret_was_replaced_are_not_resumed(tmp_path: Path, how: str) -> None:
    committed_actor(tmp_path)
    (tmp_path / run_identity.SECRET_FILE).unlink()
    needle = _plant(tmp_path, how)
    point, why = commit.find_resume_and_why(tmp_path)
    assert point is None and "global_step_3 skipped" in why and "cannot be verified" in why and needle in why


# --- another account's step in our root -----------------------------------------------------------------------------


def _their_step_copied_into(mine: Path, theirs: Path, number: int) -> Path:
    """Another account saves a step of its own (its own weights), then copies it into our root under a newer
    number, resealing the manifest as a forger without our secret can."""
    role = committed_actor(theirs)
    torch.save({"random": 666}, role / "rng/rank_00000.pt")  # its own content
    reseal_signed(role.parent, "actor/rng/rank_00000.pt")  # valid in its own root
    copy = mine / f"global_step_{number}"
    shutil.copytree(role.parent, copy)
    reseal_unsigned(copy, change=lambda man: man.update(step=number))
    return copy


def test_another_accounts_step_copied_into_our_root_is_never_resumed(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    committed_actor(mine)
    copy = _their_step_copied_into(mine, tmp_path / "theirs", 9)
    assert commit.step_problem(copy).startswith(f"{copy / 'checkpoint.json'}: its signature does not match")
    point, why = commit.find_resume_and_why(mine)
    assert point.name == "global_step_3" and why.startswith("global_step_9 skipped: ")
    # named explicitly: refused in one line naming the step and why
    t = SimpleNamespace(
        config=OmegaConf.create(
            {"trainer": {"default_local_dir": str(mine), "resume_mode": "resume_path", "resume_from_path": str(copy)}}
        )
    )
    with pytest.raises(CheckpointIncomplete, match=f"^{copy / 'checkpoint.json'}: its signature does not match"):
        trainer_io.resume_dir(t.config.trainer)
    # and a rank that opens it (the workers' load) refuses it too, before reading any file
    with pytest.raises(CheckpointIncomplete, match="its signature does not match"):
        committed_role.CommittedRole.open(copy / "actor")


def test_a_copy_with_our_marker_in_it_is_still_not_resumed(tmp_path: Path) -> None:
    """Even an account that had read our folder marker (it cannot: 0600) gains nothing: the marker only lets
    pruning delete a folder; resuming takes the signature."""
    mine = tmp_path / "mine"
    committed_actor(mine)
    copy = _their_step_copied_into(mine, tmp_path / "theirs", 9)
    shutil.copyfile(mine / "global_step_3" / commit.OWNER_FILE, copy / commit.OWNER_FILE)
    entry = commit.listing(mine)["global_step_9"]
    assert entry.ours and not entry.complete and "signature does not match" in entry.problem


def test_an_edit_of_our_own_step_without_the_secret_is_refused(tmp_path: Path) -> None:
    role = committed_actor(tmp_path)
    step = role.parent
    reseal_unsigned(step, change=lambda man: man.update(total_training_steps=1))  # an extra key, unsigned
    assert "signature does not match" in commit.step_problem(step)
    reseal_signed(step, change=lambda man: man.update(total_training_steps=1))  # signed: ours again
    assert commit.step_problem(step) == "" and commit.read_manifest(step).extra["total_training_steps"] == 1


def test_a_step_moved_to_another_root_of_ours_keeps_its_signature_with_its_root(tmp_path: Path) -> None:
    """A step is bound to the root whose run saved it: resumed there by name (resume_from_path), not as a copy."""
    a, b = tmp_path / "a", tmp_path / "b"
    committed_actor(a)
    committed_actor(b)
    assert commit.step_problem(a / "global_step_3") == ""
    shutil.copytree(a / "global_step_3", b / "global_step_7")
    reseal_unsigned(b / "global_step_7", change=lambda man: man.update(step=7))
    assert "signature does not match the run secret of" in commit.step_problem(b / "global_step_7")
    shutil.copytree(a / "global_step_3", tmp_path / "loose" / "global_step_3")  # no root secret there at all
    assert "has no run secret" in commit.step_problem(tmp_path / "loose" / "global_step_3")


# --- who may change the checkpoint root -----------------------------------------------------------------------------


@pytest.fixture
def ckroot(tmp_path: Path) -> Path:
    tmp_path.chmod(0o700)
    root = tmp_path / "ckpt"
    root.mkdir()
    return root


SHARED = [0o770, 0o775, 0o1777, 0o1770, 0o730]


@pytest.mark.parametrize("mode", SHARED)
def test_a_root_others_can_write_is_refused_on_the_cluster_sticky_or_not(ckroot: Path, mode: int) -> None:
    ckroot.chmod(mode)
    with pytest.raises(CheckpointRootError) as e:
        check_root_access(ckroot, cluster=True, environ={})
    text = str(e.value)
    assert text.startswith(f"{ckroot}: others can change what is saved there (") and "\n" not in text
    assert f"mode {mode:o}" in text and f"{ALLOW_SHARED_ROOT_ENV}=1" in text and "refused on the cluster" in text
    with pytest.raises(CheckpointRootError, match="others can change what is saved there"):
        commit.begin_step(ckroot, 1, cluster=True, environ={})
    with pytest.raises(CheckpointRootError, match="others can change what is saved there"):
        commit.find_resume_and_why(ckroot, cluster=True, environ={})
    assert list(ckroot.iterdir()) == []  # nothing written: not even the secret


@pytest.mark.parametrize("mode", SHARED)
def test_the_user_can_accept_a_shared_root_by_name_and_is_told_the_risk(ckroot: Path, mode: int) -> None:
    ckroot.chmod(mode)
    said: list[str] = []
    check_root_access(ckroot, cluster=True, environ={ALLOW_SHARED_ROOT_ENV: "1"}, say=said.append)
    assert len(said) == 1 and f"used because {ALLOW_SHARED_ROOT_ENV}=1" in said[0]
    staging = commit.begin_step(ckroot, 1, cluster=True, environ={ALLOW_SHARED_ROOT_ENV: "1"}, say=said.append)
    assert staging.is_dir() and mode_of(ckroot / run_identity.SECRET_FILE) == 0o600
    with pytest.raises(EnvError, match=f"{ALLOW_SHARED_ROOT_ENV}='yes please'"):
        check_root_access(ckroot, cluster=True, environ={ALLOW_SHARED_ROOT_ENV: "yes please"})


def test_off_the_cluster_a_shared_root_is_one_warning_line(ckroot: Path) -> None:
    ckroot.chmod(0o770)
    said: list[str] = []
    for _ in range(3):
        check_root_access(ckroot, cluster=False, environ={}, say=said.append)
    assert len(said) == 1 and "refused on a cluster profile unless" in said[0]


@pytest.mark.parametrize("allow", ["0", "1"])
def test_a_root_anyone_can_write_without_the_sticky_bit_is_refused_everywhere(ckroot: Path, allow: str) -> None:
    ckroot.chmod(0o777)
    for cluster in (False, True):
        with pytest.raises(CheckpointRootError, match="writable by every user and not sticky \\(mode 777\\)"):
            check_root_access(ckroot, cluster=cluster, environ={ALLOW_SHARED_ROOT_ENV: allow})


def test_a_level_above_the_root_others_can_write_is_refused_naming_it(tmp_path: Path) -> None:
    tmp_path.chmod(0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o775)  # a group member can rename ckpt away and put their own in its place
    root = shared / "ckpt"
    root.mkdir(mode=0o700)
    verdict = root_verdict(root, cluster=True, allow_shared=False)
    assert verdict.refusal.startswith(f"{root}: others can change what is saved there ({shared}: writable by group")
    assert root_verdict(root, cluster=True, allow_shared=True).warning
    shared.chmod(0o1777)  # sticky: they cannot rename what is ours
    assert root_verdict(root, cluster=True, allow_shared=False) == root_verdict(
        tmp_path, cluster=True, allow_shared=False
    )


def test_what_a_save_creates_is_never_writable_by_others_whatever_the_umask(tmp_path: Path) -> None:
    saved = os.umask(0o002)  # a cluster's usual user-private-group umask
    try:
        root = tmp_path / "new" / "ckpt"
        role = committed_actor(root)
    finally:
        os.umask(saved)
    for p in [tmp_path / "new", root, *root.rglob("*")]:
        assert mode_of(p) & 0o022 == 0, p
    assert root_verdict(root, cluster=True, allow_shared=False).refusal == ""
    assert role.is_dir()


def test_the_trainers_save_and_resume_apply_the_cluster_rule(ckroot: Path) -> None:
    from test_one_archive_reader import _trainer

    ckroot.chmod(0o770)
    for device, profile, refused in (
        ("npu", "a3_256die_true_weight", True),
        ("npu", "tiny", False),
        ("cpu", "tiny", False),
    ):
        t = _trainer(ckroot)
        t.config = OmegaConf.merge(t.config, {"trainer": {"device": device}, "overlay": {"profile": profile}})
        assert cluster_run(t.config) is refused
        if refused:
            with pytest.raises(CheckpointRootError, match="refused on the cluster"):
                trainer_io.save_step(t)
            with pytest.raises(CheckpointRootError, match="refused on the cluster"):
                trainer_io.load_latest(t)
        else:
            trainer_io.save_step(t)
            assert trainer_io.load_latest(t) == 2


@pytest.mark.parametrize("device", ["npu", "cpu", "cuda", None])
@pytest.mark.parametrize("profile", ["tiny", "a3_256die_true_weight", "a3_256die_random_init", None])
def test_cluster_run_is_the_one_rule_of_a_cluster_profile(device, profile) -> None:
    """An A3 profile is a cluster run whatever this host is; the tiny profile never is. The preflight's
    Context and the trainer's checkpoint-folder check ask `cluster_run` (no copy of the formula to drift)."""
    from verl_patches.launch.preflight.findings import Context
    from verl_patches.trainer.checkpoint_folder import folder_problem

    cfg = OmegaConf.create(
        {"trainer": {"device": device, "default_local_dir": "ckpt/rel"}, "overlay": {"profile": profile}}
    )
    expected = device == "npu" and profile != "tiny"
    assert cluster_run(cfg) is expected
    assert Context(cfg=cfg, settings=None, root=Path("."), host=None).cluster_profile is expected
    assert (folder_problem(cfg) is not None) is expected  # a relative folder: refused on a cluster run only


def test_the_secret_file_name_never_collides_with_what_a_resume_reads(tmp_path: Path) -> None:
    role = committed_actor(tmp_path)
    man = json.loads((role.parent / "checkpoint.json").read_text())
    assert not any(run_identity.SECRET_FILE in rel for rel in man["files"])
