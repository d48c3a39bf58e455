"""The run's identity: a secret only the job's account can read, and what is bound to it.

Every step manifest is signed with it (an HMAC-SHA256 over the manifest's content), so a step folder is
resumed only where the run that saved it can verify it: a step copied in by another account, or edited after
the save, has no valid signature, and its digests, however well resealed, are never believed. The folder
markers that say which staging, step and trash folders this root's saves created are derived from it too,
and are unreadable to others, so a marker can no longer be copied into a planted folder.

Where it lives: ``<checkpoint root>/.verl_patches_run_secret``, 64 hex digits, mode 0600, owned by the job's
account. The checkpoint root is what identifies a run across restarts (a resume is keyed on it, the launch's
log folder is new each time), it is on storage every node mounts (each rank verifies the manifest it loads),
and the secret sits beside the step folders, never inside one: copying a step folder does not carry it, and
another account cannot read it. It is created by the first save, exclusively (never replacing one) and 0600
from its first byte, and read without following a link; a secret file that is not a regular file of this
account, or that group or others can read, is refused by name, never used: whoever could read it could sign.
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base.atomic_write import create_bytes_at

SECRET_FILE = ".verl_patches_run_secret"
SECRET_BYTES = 32
_MAX_FILE_BYTES = 128
_SECRET_TEXT = re.compile(rb"([0-9a-f]{64})\n?")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# domain labels: each value derived from the secret is bound to its use
_MANIFEST_LABEL = b"verl_patches step manifest v3\0"
_OWNER_LABEL = b"verl_patches folder owner\0"
_TRASH_LABEL = b"verl_patches trash name\0"


class RunSecretError(Exception):
    """A run secret file that cannot be used (a link, another account's, readable by others, malformed, or
    unreadable); one line naming it and the fix."""


def secret_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / SECRET_FILE


def _open_root(root: Path) -> int | None:
    try:
        return os.open(root, _DIR_FLAGS)
    except (FileNotFoundError, NotADirectoryError):
        return None


def _read_at(root_fd: int, path: Path) -> bytes | None:
    try:
        fd = os.open(SECRET_FILE, _READ_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise RunSecretError(
                f"{path}: is a symbolic link; the run secret is never read through a link: remove it"
            ) from None
        raise RunSecretError(
            f"{path}: cannot be read by this account ({err.strerror}): it is not this account's run secret; "
            "checkpoints signed with it are not resumed here"
        ) from None
    try:
        st = os.fstat(fd)
        uid = os.geteuid()
        if not stat.S_ISREG(st.st_mode):
            raise RunSecretError(f"{path}: not a regular file; remove it (the next save writes a new run secret)")
        if st.st_uid != uid:
            raise RunSecretError(
                f"{path}: owned by uid {st.st_uid}, not by this account (uid {uid}): another account put it there; "
                "it is never used: remove it"
            )
        if st.st_mode & 0o077:
            raise RunSecretError(
                f"{path}: readable or writable by group/others (mode {stat.S_IMODE(st.st_mode):o}): whoever read it "
                "can sign a step; it is never used: remove it (the steps it signed are then not resumed) and save again"
            )
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    m = _SECRET_TEXT.fullmatch(data)
    if m is None:
        raise RunSecretError(f"{path}: not a run secret (64 hex digits); remove it (the next save writes a new one)")
    return bytes.fromhex(m.group(1).decode("ascii"))


def read_run_secret(root: str | os.PathLike[str]) -> bytes | None:
    """The run secret of checkpoint root ``root``; None when it has none (or there is no such folder);
    `RunSecretError` when its file cannot be used."""
    root = Path(root)
    root_fd = _open_root(root)
    if root_fd is None:
        return None
    try:
        return _read_at(root_fd, secret_path(root))
    finally:
        os.close(root_fd)


def ensure_run_secret(root: str | os.PathLike[str]) -> bytes:
    """The run secret of ``root`` (an existing folder), created by this call when it has none: a fresh
    random secret, written 0600 from its first byte and put in place only if no file has its name."""
    root = Path(root)
    existing = read_run_secret(root)
    if existing is not None:
        return existing
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        try:
            create_bytes_at(root_fd, SECRET_FILE, secrets.token_bytes(SECRET_BYTES).hex().encode() + b"\n", folder=root)
        except FileExistsError:  # another save created it first: use that one
            pass
        made = _read_at(root_fd, secret_path(root))
    finally:
        os.close(root_fd)
    if made is None:
        raise RunSecretError(f"{secret_path(root)}: disappeared right after it was written; save again")
    return made


def _derive(secret: bytes, label: bytes, content: bytes = b"") -> str:
    return hmac.new(secret, label + content, hashlib.sha256).hexdigest()


def manifest_mac(secret: bytes, content: bytes) -> str:
    """The signature of a step manifest's content (`manifest.manifest_content`)."""
    return _derive(secret, _MANIFEST_LABEL, content)


def mac_matches(secret: bytes, content: bytes, signature: str) -> bool:
    return hmac.compare_digest(manifest_mac(secret, content), signature)


@dataclass(frozen=True)
class FolderTags:
    """What marks this root's folders: ``owner`` goes in each staging/step folder's marker file (0600, never
    in a name); ``trash`` in the names of folders being deleted (public: it only lets a name be ours)."""

    owner: str
    trash: str

    @classmethod
    def of(cls, secret: bytes) -> FolderTags:
        return cls(owner=_derive(secret, _OWNER_LABEL)[:32], trash=_derive(secret, _TRASH_LABEL)[:16])


__all__ = [
    "SECRET_FILE",
    "FolderTags",
    "RunSecretError",
    "ensure_run_secret",
    "mac_matches",
    "manifest_mac",
    "read_run_secret",
    "secret_path",
]
