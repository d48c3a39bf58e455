"""The one reader of ``.pt`` files on the resume, export and check paths: never unpickles code.

``torch.load`` defaults to ``weights_only=False`` before torch 2.6 (the A3 library set has 2.5.1): a
tampered ``.pt`` then runs whatever its pickle names. And ``weights_only=True`` alone is not enough on
2.5.1: ``torch.load`` hands any zip holding ``constants.pkl`` (a TorchScript archive) to ``torch.jit.load``
before the weights-only check, and loading TorchScript runs the archive's code (``__setstate__``).
So, in this order, on one open file (a rename in between cannot swap in another file):
  1. when the caller knows the file's sha256 (a manifest records one), a differing digest is refused;
  2. the file must be a plain ``torch.save`` archive (`check_plain_archive`): a zip whose entries are all
     under one folder and are exactly those ``torch.save`` writes (``data.pkl``, ``data/<n>``, ``version``,
     ``byteorder``, ``.data/...``); a TorchScript archive is refused by name, so is any other entry, a
     legacy (non-zip) file, or a zip with duplicate names;
  3. ``torch.load(weights_only=True)``: tensors, plain containers, dtypes and numbers only.
A memory-mapped load reads the checked open file through ``/proc/self/fd`` (same inode). Every failure
is one line naming the file.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import zipfile
from typing import IO, Any, Sequence

from verl_patches.base.regular_file import FileMissing, FileRefused, open_regular_file

_CHUNK = 1 << 22  # 4 MiB reads while hashing


class CheckpointFileError(Exception):
    """A checkpoint file that is missing, not a regular file, unreadable or corrupt; names the file."""


class UnsafeCheckpointError(CheckpointFileError):
    """A checkpoint file refused for safety: its digest differs from the recorded one, or it holds pickled
    objects other than tensors and plain containers. Names the file."""


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:200]


def _weights_only_reason(err: BaseException) -> str:
    """What torch's weights-only refusal refused (its message is several lines of advice around it)."""
    for line in str(err).splitlines():
        if "GLOBAL" in line or "WeightsUnpickler error" in line:
            return line.strip().split("WeightsUnpickler error: ")[-1].split(" Please use")[0][:200]
    return _first_line(err)


def _hash_stream(f: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _open_regular(path: str | os.PathLike) -> IO[bytes]:
    """``path`` opened for reading, after checking it is a regular file (a FIFO would block the reader)."""
    try:
        return open_regular_file(path)
    except FileMissing:
        raise CheckpointFileError(f"{path}: missing") from None
    except FileRefused as err:
        raise CheckpointFileError(str(err)) from None


def sha256_file(path: str | os.PathLike) -> str:
    """The sha256 (hex) of a regular file, read in chunks."""
    with _open_regular(path) as f:
        return _hash_stream(f)


def check_digest(path: str | os.PathLike, actual: str, expected: str) -> None:
    if actual != expected:
        raise UnsafeCheckpointError(
            f"{path}: sha256 {actual[:16]}... differs from the {expected[:16]}... recorded "
            "when it was saved; the file was changed after the save, refused unread"
        )


# What torch.save (torch 2.5.1, zip format) writes under the archive's one folder; nothing else is loaded.
_PLAIN_ENTRY = re.compile(
    r"data\.pkl|byteorder|version|\.format_version|\.storage_alignment|"
    r"\.data/version|\.data/serialization_id|data/[0-9]+"
)
_ZIP_MAGIC = b"PK\x03\x04"  # torch.serialization._is_zipfile checks these bytes at offset 0


def check_plain_archive(f: IO[bytes], path: str | os.PathLike) -> None:
    """Refuse (UnsafeCheckpointError naming the file and the entry) anything but a plain torch.save zip;
    leaves ``f`` at offset 0."""
    f.seek(0)
    if f.read(4) != _ZIP_MAGIC:
        raise UnsafeCheckpointError(
            f"{path}: not a torch file in the zip format torch.save writes (a legacy or foreign format); refused unread"
        )
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        raise CheckpointFileError(f"{path}: not a readable torch file (zip: {_first_line(err)})") from None
    finally:
        f.seek(0)
    if len(names) != len(set(names)):
        dup = next(n for n in names if names.count(n) > 1)
        raise UnsafeCheckpointError(
            f"{path}: zip entry {dup[:120]!r} appears twice (readers could disagree on "
            "which one is loaded); refused unread"
        )
    folders = {n.partition("/")[0] for n in names}
    if len(folders) != 1 or any("/" not in n for n in names):
        raise UnsafeCheckpointError(
            f"{path}: zip entries are not under one archive folder ({sorted(folders)[:3]}); refused unread"
        )
    rest = [n.partition("/")[2] for n in names]
    if "constants.pkl" in rest or any(r.startswith("code/") for r in rest):
        raise UnsafeCheckpointError(
            f"{path}: a TorchScript archive (constants.pkl/code/): torch 2.5.1 would hand it "
            "to torch.jit.load, which runs its code; refused unread"
        )
    odd = next((r for r in rest if not _PLAIN_ENTRY.fullmatch(r)), None)
    if odd is not None:
        raise UnsafeCheckpointError(f"{path}: zip entry {odd[:120]!r} is not one torch.save writes; refused unread")
    if "data.pkl" not in rest:
        raise CheckpointFileError(f"{path}: not a readable torch file (no data.pkl)")


def _torch_load(
    source: Any, path: str | os.PathLike, mmap: bool, map_location: str, safe_globals: Sequence[Any]
) -> Any:
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch

    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(source, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        # the weights-only unpickler met a global it does not allow (a class, a function): never run it
        raise UnsafeCheckpointError(
            f"{path}: refused by the weights-only loader: not a torch file of tensors and "
            f"plain containers ({_weights_only_reason(err)})"
        ) from None
    except Exception as err:  # noqa: BLE001 - a corrupt archive raises many types; one line names the file
        raise CheckpointFileError(
            f"{path}: not a readable torch file ({type(err).__name__}: {_first_line(err)})"
        ) from None


def load_tensor_file(
    path: str | os.PathLike,
    *,
    mmap: bool = False,
    expected_sha256: str | None = None,
    map_location: str = "cpu",
    safe_globals: Sequence[Any] = (),
) -> Any:
    """The content of a ``.pt`` file, loaded with ``weights_only=True``.

    With ``expected_sha256`` the file is hashed first and refused (UnsafeCheckpointError naming it) when the
    digest differs. ``mmap=True`` maps the storages instead of reading them (torch then needs the path; the
    digest is checked on the same path just before). ``safe_globals`` adds data-only classes the weights-only
    unpickler may build (Megatron's rank files hold an ``argparse.Namespace``); never a callable that acts.
    """
    with _open_regular(path) as f:
        if expected_sha256 is not None:
            check_digest(path, _hash_stream(f), expected_sha256)
        check_plain_archive(f, path)
        if mmap:  # torch maps by name: the name of this open file, not the path (which may be swapped since)
            return _torch_load(f"/proc/self/fd/{f.fileno()}", path, True, map_location, safe_globals)
        return _torch_load(f, path, False, map_location, safe_globals)
