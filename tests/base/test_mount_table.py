"""The mount table is read as the kernel writes it (issue 41, class 7): escaped mount points are decoded, so a
tmpfs mounted at a path holding a backslash, a space, a tab or a newline is seen as tmpfs, not as the
filesystem above it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from verl_patches.base.mount_table import Mount, filesystem_type, mount_holding, parse_mountinfo, unescape

REPO = Path(__file__).resolve().parents[2]


def kernel_escape(text: str) -> bytes:
    """What fs/proc_namespace.c writes for a field: space, tab, newline and backslash as \\ooo."""
    raw = text.encode("utf-8", "surrogateescape")
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in raw)


def line(point: str, fstype: str, n: int = 30, source: str = "none", optional: str = "shared:1") -> bytes:
    fields = [str(n).encode(), b"1", b"0:%d" % n, b"/", kernel_escape(point), b"rw,relatime"]
    fields += [o.encode() for o in optional.split()] + [b"-", kernel_escape(fstype), kernel_escape(source), b"rw"]
    return b" ".join(fields)


def table(*lines: bytes) -> bytes:
    return b"\n".join(lines) + b"\n"


BASE = [line("/", "overlay", 1), line("/data", "ext4", 2, "/dev/sda1"), line("/proc", "proc", 3, "proc", "")]


@pytest.mark.parametrize("odd", ["ck\\pt", "my ckpt", "tab\there", "new\nline", "a\rb", "x\x0cy", "ünï", "\\040"])
def test_a_tmpfs_at_a_path_with_an_escaped_character_is_tmpfs(tmp_path: Path, odd: str) -> None:
    point = f"/data/{odd}"
    t = tmp_path / "mountinfo"
    t.write_bytes(table(*BASE, line(point, "tmpfs", 40, "tmpfs")))
    assert filesystem_type(f"{point}/global_step_2", table=str(t)) == "tmpfs"
    assert filesystem_type(point, table=str(t)) == "tmpfs"
    assert filesystem_type("/data/other", table=str(t)) == "ext4"
    assert filesystem_type("/data", table=str(t)) == "ext4"


def test_the_former_reading_took_a_backslashed_tmpfs_for_ext4() -> None:
    """The premise: splitting on whitespace and decoding only \\040 misses the tmpfs."""
    raw = table(*BASE, line("/data/ck\\pt", "tmpfs", 40)).decode()
    best, kind = "", None
    for ln in raw.splitlines():  # the reading preflight_checkpoint used (/proc/mounts: point, then type)
        parts = ln.split()
        point = parts[4].replace("\\040", " ")
        if ("/data/ck\\pt/x" + "/").startswith(point.rstrip("/") + "/") and len(point) >= len(best):
            best, kind = point, parts[parts.index("-") + 1]
    assert kind == "ext4"
    assert mount_holding("/data/ck\\pt/x", parse_mountinfo(raw.encode())).fstype == "tmpfs"


def test_the_longest_holding_mount_wins_and_the_later_of_two_equal_ones() -> None:
    mounts = parse_mountinfo(
        table(*BASE, line("/data2", "nfs4", 4), line("/data/x", "xfs", 5), line("/data/x", "tmpfs", 6))
    )
    assert mount_holding("/data2/a", mounts).fstype == "nfs4"
    assert mount_holding("/data/x2", mounts).fstype == "ext4"  # /data/x is not a parent of /data/x2
    assert mount_holding("/data/x/y", mounts).fstype == "tmpfs"  # mounted over the xfs
    assert mount_holding("/etc", mounts).fstype == "overlay"
    assert mount_holding("/etc", []) is None


def test_lines_that_are_not_mountinfo_lines_are_skipped() -> None:
    mounts = parse_mountinfo(
        b"garbage\n\n1 2 3\n"
        + line("/a", "ext4", 7, optional="")
        + b"\n"
        + line("/b", "fuse.sshfs", 8, optional="shared:3 master:2 propagate_from:1")
        + b"\n"
        + b"9 1 0:9 / relative rw - tmpfs x rw\n"  # a mount point is absolute
        + b"10 1 0:10 / /c rw -\n"  # no type, no source
    )
    assert mounts == [Mount("/a", "ext4", "none"), Mount("/b", "fuse.sshfs", "none")]


@given(
    st.lists(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="/\x00"), min_size=1, max_size=12),
        min_size=1,
        max_size=6,
        unique=True,
    )
)
def test_any_mount_point_the_kernel_can_write_reads_back_exactly(names: list[str]) -> None:
    points = [f"/mnt/{n}" for n in names]
    mounts = parse_mountinfo(table(*BASE, *(line(p, f"fs{i}", 50 + i) for i, p in enumerate(points))))
    assert [m.point for m in mounts[len(BASE) :]] == points
    for i, p in enumerate(points):
        assert mount_holding(f"{p}/file", mounts).fstype == f"fs{i}"


def test_unescape_decodes_only_three_octal_digits() -> None:
    assert unescape(b"a\\040b\\011c\\012d\\134e") == "a b\tc\nd\\e"
    assert unescape(b"\\04") == "\\04" and unescape(b"\\0400") == " 0" and unescape(b"\\8xx") == "\\8xx"


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a private mount namespace")
def test_a_real_tmpfs_mounted_at_a_backslashed_path_is_tmpfs(tmp_path: Path) -> None:
    """End to end: a tmpfs really mounted (in a private user and mount namespace) at ``ck\\pt dir``, read by
    the preflight's filesystem_type from the kernel's own table."""
    point = tmp_path / "ck\\pt dir\ttab"
    point.mkdir()
    probe = (
        "import os, sys\n"
        "from verl_patches.base.mount_table import mount_holding, read_mount_table\n"
        "from verl_patches.launch.preflight.checkpoint import filesystem_type\n"
        "m = mount_holding(os.path.realpath(sys.argv[1]), read_mount_table())\n"
        "print(repr((filesystem_type(sys.argv[1]), m.point, m.source)))\n"
    )
    script = 'mount -t tmpfs verl-test "$1" && exec "$2" -c "$3" "$1/global_step_2"'
    r = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(point), sys.executable, probe],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    if r.returncode != 0 and "Operation not permitted" in r.stderr:
        pytest.skip(f"no private mount namespace here: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr(("tmpfs", os.path.realpath(point), "verl-test"))
