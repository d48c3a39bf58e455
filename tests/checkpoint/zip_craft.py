"""Zip archives built byte by byte, for the archive-reader tests: the variants two zip readers disagree on.

Each variant starts from the records of a genuine ``torch.save`` archive (so torch's reader accepts its
structure) and is laid out here with explicit local headers, central directories and end records, so a test
controls exactly what each reader is shown. Stored (uncompressed) records, data aligned to 64 bytes as
``torch.save`` aligns them (the memory-mapped load slices records out of the mapped file).

Readers' differences used (Python 3.11's ``zipfile`` against torch 2.5.1's miniz reader):
* zip64: ``zipfile`` reads the zip64 end record just before the locator, miniz the one the locator's offset
  names;
* central directory offset: ``zipfile`` places the directory where its size says (just before the end
  record, for prefixed archives), miniz where its offset says;
* names: miniz looks a record up ignoring case; ``zipfile`` keeps both of two equal names.
"""

from __future__ import annotations

import pickle
import struct
import zipfile
import zlib
from pathlib import Path

Entry = tuple[str, bytes]  # (name inside the zip, with its archive folder; data)

_LOCAL, _CENTRAL, _END, _END64, _LOCATOR64 = 0x04034B50, 0x02014B50, 0x06054B50, 0x06064B50, 0x07064B50


def records_of(path: Path) -> list[Entry]:
    """The records of a genuine archive, in order (read with ``zipfile``: the file is our own torch.save)."""
    with zipfile.ZipFile(path) as z:
        return [(n, z.read(n)) for n in z.namelist()]


def folder_of(entries: list[Entry]) -> str:
    return entries[0][0].split("/", 1)[0]


def local_header(name: str, data: bytes, at: int, align: int = 64) -> bytes:
    """A stored local record starting at offset ``at``, its data padded (extra field) to ``align``."""
    raw = name.encode()
    pad = (-(at + 30 + len(raw) + 4)) % align
    extra = struct.pack("<HH", 0x4246, pad) + b"Z" * pad
    head = struct.pack(
        "<IHHHHHIIIHH", _LOCAL, 20, 0, 0, 0, 0x21, zlib.crc32(data), len(data), len(data), len(raw), len(extra)
    )
    return head + raw + extra + data


def central_header(name: str, data: bytes, offset: int, extra: bytes = b"") -> bytes:
    raw = name.encode()
    head = struct.pack(
        "<IHHHHHHIIIHHHHHII",
        _CENTRAL,
        20,
        20,
        0,
        0,
        0,
        0x21,
        zlib.crc32(data),
        len(data),
        len(data),
        len(raw),
        len(extra),
        0,
        0,
        0,
        0,
        offset,
    )
    return head + raw + extra


def end_record(count: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack("<IHHHHIIH", _END, 0, 0, count, count, cd_size, cd_offset, 0)


def zip64_end_record(count: int, cd_size: int, cd_offset: int) -> bytes:
    return struct.pack("<IQHHIIQQQQ", _END64, 44, 45, 45, 0, 0, count, count, cd_size, cd_offset)


def zip64_locator(end64_offset: int) -> bytes:
    return struct.pack("<IIQI", _LOCATOR64, 0, end64_offset, 1)


def lay_out(entries: list[Entry], start: int = 0) -> tuple[bytearray, list[int]]:
    """Local records of ``entries`` back to back (offsets counted from ``start``) and each one's offset."""
    buf, offsets = bytearray(), []
    for name, data in entries:
        offsets.append(start + len(buf))
        buf += local_header(name, data, start + len(buf))
    return buf, offsets


def directory(entries: list[Entry], offsets: list[int]) -> bytes:
    return b"".join(central_header(n, d, o) for (n, d), o in zip(entries, offsets))


def plain_zip(entries: list[Entry], start: int = 0) -> bytes:
    """A well-formed zip of ``entries`` (duplicates kept) whose offsets count from ``start``."""
    buf, offs = lay_out(entries, start)
    cd = directory(entries, offs)
    return bytes(buf + cd + end_record(len(entries), len(cd), start + len(buf)))


def zip64_zip(entries: list[Entry]) -> bytes:
    """A well-formed zip64 archive (the form torch.save writes past 4 GiB or 65535 records)."""
    buf, offs = lay_out(entries)
    cd = directory(entries, offs)
    cd_at = len(buf)
    buf += cd
    end64_at = len(buf)
    buf += zip64_end_record(len(entries), len(cd), cd_at) + zip64_locator(end64_at)
    return bytes(buf + end_record(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF))


def _union(a: list[Entry], b: list[Entry]) -> tuple[bytearray, dict[str, int]]:
    entries = a + [e for e in b if e not in a]
    buf, offs = lay_out(entries)
    return buf, {n: o for (n, _), o in zip(entries, offs)}


def zip64_two_ends(shown_to_zipfile: list[Entry], shown_to_torch: list[Entry]) -> bytes:
    """Two zip64 end records: the locator names the one listing ``shown_to_torch``; the one just before the
    locator (where ``zipfile`` reads) lists ``shown_to_zipfile``."""
    buf, at = _union(shown_to_torch, shown_to_zipfile)
    cd_t = directory(shown_to_torch, [at[n] for n, _ in shown_to_torch])
    t_at = len(buf)
    buf += cd_t
    end_t = len(buf)
    buf += zip64_end_record(len(shown_to_torch), len(cd_t), t_at)
    cd_z = directory(shown_to_zipfile, [at[n] for n, _ in shown_to_zipfile])
    z_at = len(buf)
    buf += cd_z + zip64_end_record(len(shown_to_zipfile), len(cd_z), z_at) + zip64_locator(end_t)
    return bytes(buf + end_record(0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF))


def offset_mismatch(shown_to_zipfile: list[Entry], shown_to_torch: list[Entry]) -> bytes:
    """One end record whose directory offset names the directory listing ``shown_to_torch`` while another
    directory of the same size sits just before the end record (where ``zipfile`` places it, taking the
    difference for prefixed data) listing ``shown_to_zipfile``."""
    buf, at = _union(shown_to_torch, shown_to_zipfile)
    cd_t = directory(shown_to_torch, [at[n] for n, _ in shown_to_torch])
    parts = [central_header(n, d, at[n]) for n, d in shown_to_zipfile]
    short = len(cd_t) - sum(map(len, parts)) - 4
    assert short >= 0, "the torch-side directory must be the longer one"
    name, data = shown_to_zipfile[-1]
    parts[-1] = central_header(name, data, at[name], extra=struct.pack("<HH", 0x4242, short) + b"\0" * short)
    cd_z = b"".join(parts)
    assert len(cd_z) == len(cd_t)
    t_at = len(buf)
    buf += cd_t + cd_z
    return bytes(buf + end_record(len(shown_to_torch), len(cd_t), t_at))


def overlapping(entries: list[Entry], alias: str, target: str) -> bytes:
    """A zip whose directory also lists ``alias`` at the local record of ``target`` (two names, one record)."""
    buf, offs = lay_out(entries)
    i = [n for n, _ in entries].index(target)
    cd = directory(entries, offs) + central_header(alias, entries[i][1], offs[i])
    return bytes(buf + cd + end_record(len(entries) + 1, len(cd), len(buf)))


def prefixed(prefix: bytes, entries: list[Entry], absolute: bool) -> bytes:
    """``prefix`` then a zip of ``entries`` whose offsets count from the file's start (``absolute``) or from
    the zip's own start (a zip appended as it is: readers that add the prefix's length find its records)."""
    return prefix + plain_zip(entries, start=len(prefix) if absolute else 0)


class Payload:
    """Unpickling this runs ``touch marker``: what a tampered checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def payload_pickle(marker: Path) -> bytes:
    return pickle.dumps(Payload(marker), protocol=2)
