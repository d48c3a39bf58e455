"""Which filesystem a path is on, from the kernel's mount table (``/proc/self/mountinfo``).

The kernel writes each mount point (and source and type) with four characters escaped as a backslash and
three octal digits: space ``\\040``, tab ``\\011``, newline ``\\012`` and backslash ``\\134``. A reader that
leaves the escapes in place, or splits on any whitespace, misreads a mount at a path holding one of them: a
tmpfs mounted at ``/data/ck\\pt`` then passes as the ext4 above it. So the table is read as bytes, split on
the only separators the kernel writes (``\\n`` between mounts, one space between fields: a path may hold a
carriage return or a form feed unescaped), every field is decoded, and the mount of a path is the longest
mount point that holds it (of two equal ones the later, which is mounted over the earlier).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MOUNTINFO = "/proc/self/mountinfo"
MAX_TABLE_BYTES = 64 << 20  # a host with containers can have tens of thousands of mounts; never unbounded

_ESCAPE = re.compile(rb"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    point: str  # where it is mounted, as this process sees it
    fstype: str  # "ext4", "tmpfs", "fuse.sshfs"...
    source: str


def unescape(field: bytes) -> str:
    """A mount table field with the kernel's octal escapes decoded (bytes that are not UTF-8 kept, as
    ``os.fsdecode`` keeps them, so the result compares equal to a path naming the same bytes)."""
    return os.fsdecode(_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field))


def parse_mountinfo(table: bytes) -> list[Mount]:
    """The mounts of a ``mountinfo`` table, in its order. Each line is ``id parent major:minor root point
    options [optional fields...] - fstype source super-options``; a line that is not is skipped."""
    out = []
    for line in table.split(b"\n"):
        fields = line.split(b" ")
        try:
            dash = fields.index(b"-", 6)  # the optional fields end at a lone "-"; none of the six before is one
        except ValueError:
            continue
        if len(fields) < dash + 3 or not fields[4].startswith(b"/"):
            continue
        out.append(
            Mount(point=unescape(fields[4]), fstype=unescape(fields[dash + 1]), source=unescape(fields[dash + 2]))
        )
    return out


def mount_holding(path: str, mounts: list[Mount]) -> Mount | None:
    """The mount ``path`` (absolute, links resolved) is on: the longest mount point that is ``path`` or one of
    its parents, the later of two equal ones; None when no mount holds it."""
    best: Mount | None = None
    for m in mounts:
        inside = path == m.point or path.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


def read_mount_table(table: str = MOUNTINFO) -> list[Mount] | None:
    """This process's mounts, or None when the table cannot be read."""
    try:
        with open(table, "rb") as f:
            return parse_mountinfo(f.read(MAX_TABLE_BYTES))
    except OSError:
        return None


def filesystem_type(path: str | os.PathLike[str], table: str = MOUNTINFO) -> str | None:
    """The type of the filesystem ``path`` is on, or None when it cannot be told."""
    mounts = read_mount_table(table)
    if mounts is None:
        return None
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        return None
    found = mount_holding(real, mounts)
    return found.fstype if found is not None else None
