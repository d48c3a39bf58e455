"""The one reader of ``.pt`` files on the resume, export, C1 and check paths: never unpickles code.

``torch.load`` defaults to ``weights_only=False`` before torch 2.6 (the A3 library set has 2.5.1): a
tampered ``.pt`` then runs whatever its pickle names. And ``weights_only=True`` alone is not enough on
2.5.1: ``torch.load`` hands any zip whose records include ``constants.pkl`` (a TorchScript archive) to
``torch.jit.load`` before the weights-only check, and loading TorchScript runs the archive's code.

Which records a zip holds depends on who reads it: Python's ``zipfile`` and torch's own reader (miniz, in
``PyTorchFileReader``) disagree on crafted files (a zip64 end locator pointing elsewhere than the record
before it, a central directory offset that is not where its size places it), so a check made with one
reader says nothing about what the other loads. Here the file is parsed once, by torch's reader, and that
parse is what torch loads from:
  1. the file is opened once (a rename in between cannot swap in another file); when the caller knows its
     sha256 (a manifest records one), a differing digest is refused unread;
  2. one ``torch._C.PyTorchFileReader`` reads the open file; its record names must be exactly those
     ``torch.save`` writes (`plain_archive_problem`): a TorchScript archive, any other record, two records
     one name apart only in case (the reader finds a record by name ignoring case), a legacy (non-zip) file
     are refused by name;
  3. that same reader object goes to torch's archive loader (``torch.serialization._load``) with the
     weights-only unpickler: tensors, plain containers, dtypes and numbers only. ``torch.load``'s dispatch to
     ``torch.jit.load`` is not on this path at all; `MIRRORED` pins the torch code this mirrors.
A memory-mapped load maps the checked open file through ``/proc/self/fd`` (same inode). A file whose size,
times or inode change while it is read (written in place) is refused. Every failure is one line naming
the file.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
from collections.abc import Sequence
from typing import Any, BinaryIO

from verl_patches.base.regular_file import FileMissing, FileRefused, open_regular_file

_CHUNK = 1 << 22  # 4 MiB reads while hashing

# the torch definitions `_load_archive` mirrors -> their fingerprint (verl_patches.patching.fingerprint); a
# test compares them with the installed torch, so a torch whose loader changed is noticed before it is used
MIRRORED = {
    "torch.serialization:load": "sha256:cb90e9a8faafde52",
    "torch.serialization:_load": "sha256:53158cc4005c0494",
    "torch.serialization:_is_torchscript_zip": "sha256:b417d274d46e234d",
}


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


def _hash_stream(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def _open_regular(path: str | os.PathLike[str]) -> BinaryIO:
    """``path`` opened for reading, after checking it is a regular file (a FIFO would block the reader)."""
    try:
        return open_regular_file(path)
    except FileMissing:
        raise CheckpointFileError(f"{path}: missing") from None
    except FileRefused as err:
        raise CheckpointFileError(str(err)) from None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """The sha256 (hex) of a regular file, read in chunks."""
    with _open_regular(path) as f:
        return _hash_stream(f)


def check_digest(path: str | os.PathLike[str], actual: str, expected: str) -> None:
    if actual != expected:
        raise UnsafeCheckpointError(
            f"{path}: sha256 {actual[:16]}... differs from the {expected[:16]}... recorded "
            "when it was saved; the file was changed after the save, refused unread"
        )


# What torch.save (torch 2.5.1, zip format) writes under the archive's one folder; nothing else is loaded.
_PLAIN_RECORD = re.compile(
    r"data\.pkl|byteorder|version|\.format_version|\.storage_alignment|"
    r"\.data/version|\.data/serialization_id|data/[0-9]+"
)
_ZIP_MAGIC = b"PK\x03\x04"  # torch.serialization._is_zipfile checks these bytes at offset 0


def plain_archive_problem(records: Sequence[str]) -> str | None:
    """Why ``records`` (record names as torch's reader lists them, without the archive folder) are not what
    ``torch.save`` writes, or None when they are."""
    seen: dict[str, str] = {}
    for name in records:
        # torch's reader looks a record up by name ignoring case: 'data.pkl' would find either of two
        # records spelled 'data.pkl' and 'DATA.PKL', so names are unique only when unique without case
        key = name.casefold()
        if key in seen:
            spelled = "" if seen[key] == name else f" (as {seen[key][:120]!r}: torch finds records ignoring case)"
            return f"zip entry {name[:120]!r} appears twice{spelled}; readers could disagree on which one is loaded"
        seen[key] = name
    if "constants.pkl" in records or any(r.startswith("code/") for r in records):
        return (
            "a TorchScript archive (constants.pkl/code/): torch 2.5.1 would hand it to torch.jit.load, "
            "which runs its code"
        )
    odd = next((r for r in records if not _PLAIN_RECORD.fullmatch(r)), None)
    if odd is not None:
        return f"zip entry {odd[:120]!r} is not one torch.save writes"
    if "data.pkl" not in records:
        return "no data.pkl: not an archive torch.save writes"
    return None


def _file_state(fd: int) -> tuple[int, ...]:
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _load_archive(
    f: BinaryIO, path: str | os.PathLike[str], mmap: bool, map_location: str, safe_globals: Sequence[Any]
) -> Any:
    """Parse the open file ``f`` once with torch's reader, check its records, load from that parse."""
    # lazy: torch is heavy and only this path needs it; importing this module stays light
    import torch
    from torch import _weights_only_unpickler

    f.seek(0)
    if f.read(4) != _ZIP_MAGIC:
        raise UnsafeCheckpointError(
            f"{path}: not a torch file in the zip format torch.save writes (a legacy or foreign format); refused unread"
        )
    f.seek(0)  # the reader reads relative to where the file stands
    try:
        reader = torch._C.PyTorchFileReader(f)
    except Exception as err:  # noqa: BLE001 - the C++ reader raises RuntimeError and more; one line names the file
        raise CheckpointFileError(f"{path}: not a readable torch file (zip: {_first_line(err)})") from None
    try:
        records = reader.get_all_records()  # type: ignore[attr-defined]  # torch 2.5 has it; its stub does not
    except Exception as err:  # noqa: BLE001 - a record outside the archive folder of the first one
        raise UnsafeCheckpointError(
            f"{path}: zip entries are not under one archive folder ({_first_line(err)}); refused unread"
        ) from None
    problem = plain_archive_problem(records)
    if problem is not None:
        raise UnsafeCheckpointError(f"{path}: {problem}; refused unread")
    try:
        overall = None
        if mmap:  # torch.load maps by name; this is the name of the open file, not the path (may be swapped since)
            size = os.fstat(f.fileno()).st_size
            overall = torch.UntypedStorage.from_file(f"/proc/self/fd/{f.fileno()}", False, size)
        with torch.serialization.safe_globals(list(safe_globals)):
            # what torch.load(weights_only=True) runs for a zip that is not TorchScript, on our parse
            return torch.serialization._load(  # type: ignore[no-untyped-call]  # torch's private loader is unannotated
                reader, map_location, _weights_only_unpickler, overall_storage=overall, encoding="utf-8"
            )
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
    path: str | os.PathLike[str],
    *,
    mmap: bool = False,
    expected_sha256: str | None = None,
    map_location: str = "cpu",
    safe_globals: Sequence[Any] = (),
) -> Any:
    """The content of a ``.pt`` file: a plain ``torch.save`` archive, loaded weights-only (see the module).

    With ``expected_sha256`` the file is hashed first and refused (UnsafeCheckpointError naming it) when the
    digest differs. ``mmap=True`` maps the storages instead of reading them. ``safe_globals`` adds data-only
    classes the weights-only unpickler may build (Megatron's rank files hold an ``argparse.Namespace``);
    never a callable that acts.
    """
    with _open_regular(path) as f:
        before = _file_state(f.fileno())
        if expected_sha256 is not None:
            check_digest(path, _hash_stream(f), expected_sha256)
        obj = _load_archive(f, path, mmap, map_location, safe_globals)
        if _file_state(f.fileno()) != before:
            raise CheckpointFileError(f"{path}: changed while it was being read (written in place?); not loaded")
        return obj
