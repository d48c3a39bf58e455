"""One node's side of `gather_logs`: this node's logs of one run, written to stdout as a tar stream.

What belongs to the run (the head's run folder, e.g. ``logs/a3_256die_true_weight-20250701-134002-head-a3-node-01``,
gives the profile and the start time; the other nodes started within WAIT_TIMEOUT_S of it):
  * ``run/<folder>/``: the launcher's run folders of that profile on this node started within the window
    (launcher.log with the hang report as its last line, trainer.log, ray.log, pids.json, ...);
  * ``ray/<session>/logs/``: Ray's sessions started within the window (every worker's stdout/stderr, raylet);
  * ``flight_recorder/``: torch_npu's HCCL flight-recorder dumps (``<prefix><rank>`` and ``..._py_traceback``)
    written since the window opened;
  * ``ascend/``: CANN's logs (plog, device logs) written since then.

Other accounts can write where some of these live (``/tmp``, Ray's session root), so what is found there is
treated as hostile. Folders are walked through descriptors: each name is opened relative to its folder's
descriptor with ``O_NOFOLLOW``, so no name at any depth is resolved through a symbolic link, and a folder
swapped for a link between listing and opening is refused, not followed. A file is sent only when the
descriptor it is read from is a regular file, the same one that was listed, owned by this account, with a
single link (a hard link can make a file of elsewhere appear here); its permission bits travel with it.
Everything else (links, FIFOs, sockets, devices, unreadable files, names that are not printable UTF-8, folders
of another account or filesystem) is listed as skipped with a one-line reason, never opened for reading. A file
over --max-file-mib is cut to its end (what explains a failure); --max-node-gib and --deadline-s bound the
whole. ``gather_manifest.json``, the last member, lists what was sent and skipped.

    python -m verl_patches.launch.cluster.node_logs --run-dir LOG_DIR/<head run folder> [--window-s S] > node.tar
"""

from __future__ import annotations

import argparse
import dataclasses
import errno
import io
import json
import os
import re
import socket
import stat
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import IO

from verl_patches.base.finite_float import float_arg
from verl_patches.launch.job_env import FLIGHT_RECORDER_FILE

RUN_FOLDER = re.compile(r"(?P<name>[A-Za-z0-9_.]+)-(?P<stamp>\d{8}-\d{6})-(?P<role>head|worker|local)-.+", re.ASCII)
RAY_SESSION = re.compile(r"session_(?P<stamp>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})_\d+_\d+", re.ASCII)
MANIFEST = "gather_manifest.json"
MAX_DEPTH = 24  # folders below a walked root; gather_logs accepts 32 name parts, the member prefix takes 3
MAX_LISTED = 2000  # entries of each list in the manifest; the rest are counted (a planted folder of 10**6 FIFOs)
_CHUNK = 1 << 20
_DIR_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO put in a file's place between the listing and the open must not block the open
_FILE_OPEN = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = {
    stat.S_IFLNK: "a symbolic link (not followed)",
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a folder",
    stat.S_IFREG: "a file, not a folder",
}


class NodeLogsError(ValueError):
    """The run folder's name or a path option cannot be used; one line naming it."""


@dataclass(frozen=True)
class RunWindow:
    name: str  # the profile (or "tiny")
    start: float  # the head's start, seconds since the epoch (local time of the nodes, as the folder names are)
    window_s: float

    def holds(self, t: float) -> bool:
        return abs(t - self.start) <= self.window_s


def stamp_time(stamp: str, fmt: str) -> float | None:
    """Seconds since the epoch of a folder name's time stamp, or None when it is no valid time (month 13)."""
    try:
        return time.mktime(time.strptime(stamp, fmt))
    except (ValueError, OverflowError):
        return None


def run_window(run_dir: str, window_s: float) -> RunWindow:
    name = PurePosixPath(run_dir).name
    m = RUN_FOLDER.fullmatch(name)
    start = stamp_time(m["stamp"], "%Y%m%d-%H%M%S") if m else None
    if m is None or start is None:
        raise NodeLogsError(
            f"--run-dir {shown(run_dir)}: not a run folder of the launcher "
            "(<profile>-<YYYYmmdd>-<HHMMSS>-<role>-<host>)"
        )
    return RunWindow(m["name"], start, window_s)


def shown(name: str) -> str:
    """A name as printable ASCII (non-UTF-8 bytes, newlines and other controls escaped): safe in a one-line reason."""
    return repr(name.encode("utf-8", "surrogateescape"))[2:-1]


def name_problem(name: str) -> str | None:
    """Why a file name cannot travel as a member name (None when it can): the gathering side takes printable
    UTF-8 names only, and a name is never rewritten (two rewritten names could collide)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a name with a control character (newline, tab, ...)"
    if "\\" in name:
        return "a name with a backslash"
    return None


def kind_of(mode: int) -> str:
    """What a non-regular file is, in words (for the skip reason)."""
    return _KINDS.get(stat.S_IFMT(mode), f"not a regular file (type {stat.S_IFMT(mode):o})")


@dataclass
class Sent:
    files: int = 0
    bytes: int = 0
    parts: dict[str, list[str]] = field(default_factory=dict)  # section -> folders or files sent
    skipped: list[dict[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    not_listed: int = 0  # entries of the lists above beyond MAX_LISTED, counted only
    stopped: str = ""

    def skip(self, path: str, why: str) -> None:
        if len(self.skipped) < MAX_LISTED:
            self.skipped.append({"path": path, "why": why})
        else:
            self.not_listed += 1

    def part(self, section: str, name: str) -> None:
        names = self.parts.setdefault(section, [])
        if len(names) < MAX_LISTED:
            names.append(name)
        else:
            self.not_listed += 1


@dataclass(frozen=True)
class Source:
    """A regular file as listed: opened later relative to `dir_fd` (open while the walk is at it)."""

    dir_fd: int
    name: str
    member: str
    path: str  # shown
    listed: os.stat_result
    section: str = ""  # the manifest's part it is listed under once sent (files of their own: dumps, CANN logs)


def _open_child(dir_fd: int, name: str, listed: os.stat_result, path: str, sent: Sent) -> int | None:
    """The sub-folder `name` of `dir_fd`, proven to be the folder listed (not a link put there since), on the
    same filesystem and owned by this account; None (and a skip reason) otherwise."""
    try:
        fd = os.open(name, _DIR_OPEN, dir_fd=dir_fd)
    except OSError as e:
        swapped = e.errno in (errno.ELOOP, errno.ENOTDIR)
        sent.skip(
            path,
            "replaced by a link or a file while gathered (not followed)"
            if swapped
            else f"cannot be opened ({e.strerror})",
        )
        return None
    st = os.fstat(fd)
    problem = _ownership_problem(st, listed)
    if problem:
        os.close(fd)
        sent.skip(path, problem)
        return None
    return fd


def _ownership_problem(st: os.stat_result, listed: os.stat_result) -> str | None:
    if (st.st_dev, st.st_ino) != (listed.st_dev, listed.st_ino):
        return "replaced while gathered (not the entry listed)"
    if st.st_uid != os.geteuid():
        return f"owned by uid {st.st_uid}, not by this account (uid {os.geteuid()})"
    return None


def _walk(dir_fd: int, path: str, arc: str, sent: Sent, depth: int = 0) -> Iterator[Source]:
    """Regular files below the open folder `dir_fd` (listed, not yet opened), with their member names."""
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as e:
        sent.skip(path, f"cannot be listed ({e.strerror})")
        return
    here = os.fstat(dir_fd)
    for name in names:
        child = f"{path}/{shown(name)}"
        problem = name_problem(name)
        if problem:
            sent.skip(child, problem)
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as e:
            sent.skip(child, f"unreadable ({e.strerror})")
            continue
        if stat.S_ISREG(st.st_mode):
            yield Source(dir_fd, name, f"{arc}/{name}", child, st)
        elif not stat.S_ISDIR(st.st_mode):
            sent.skip(child, kind_of(st.st_mode))
        elif depth >= MAX_DEPTH:
            sent.skip(child, f"a folder more than {MAX_DEPTH} levels down (not walked)")
        elif st.st_dev != here.st_dev:
            sent.skip(child, "another filesystem mounted here (not crossed)")
        else:
            fd = _open_child(dir_fd, name, st, child, sent)
            if fd is not None:
                try:
                    yield from _walk(fd, child, f"{arc}/{name}", sent, depth + 1)
                finally:
                    os.close(fd)


def _entries(dir_fd: int) -> list[str]:
    try:
        return sorted(os.listdir(dir_fd))
    except OSError:
        return []


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError:
        return None


@dataclass(frozen=True)
class Roots:
    """The folders to look in, as name parts below the node's root (none of them '..')."""

    log_dir: tuple[str, ...]
    ray_dir: tuple[str, ...]
    flight_dir: tuple[str, ...]
    flight_prefix: str
    ascend_dir: tuple[str, ...]


def _parts(path: str, what: str) -> tuple[str, ...]:
    parts = PurePosixPath(path).parts
    parts = parts[1:] if parts and parts[0] == "/" else parts
    if ".." in parts or any(name_problem(p) for p in parts):
        raise NodeLogsError(f"{what} {shown(path)}: give a plain path (no '..', printable UTF-8)")
    return parts


def roots_of(args: argparse.Namespace) -> Roots:
    """Every path option as name parts below the node's root: a relative one is read from that root too."""
    flight = _parts(args.flight_recorder_prefix, "--flight-recorder-prefix")
    if not flight:
        raise NodeLogsError("--flight-recorder-prefix: empty")
    return Roots(
        log_dir=_parts(str(PurePosixPath(args.run_dir).parent), "--run-dir"),
        ray_dir=_parts(args.ray_dir, "--ray-dir"),
        flight_dir=flight[:-1],
        flight_prefix=flight[-1],
        ascend_dir=_parts(os.path.expanduser(args.ascend_log_dir), "--ascend-log-dir"),
    )


def _root(root_fd: int, parts: tuple[str, ...], sent: Sent) -> int | None:
    """The folder `parts` below the node's root, opened one name at a time and never through a link; None
    (and a skip reason naming the name at fault) when it cannot be."""
    fd = os.dup(root_fd)
    for i, part in enumerate(parts):
        try:
            inner = os.open(part, _DIR_OPEN, dir_fd=fd)
        except OSError as e:
            st = _lstat(fd, part)
            os.close(fd)
            at = "/" + "/".join(parts[: i + 1])
            if st is not None and stat.S_ISLNK(st.st_mode):
                why = f"a symbolic link at {at} (not followed; give the real path)"
            elif st is None:
                why = f"no such folder on this node ({at})"
            elif not stat.S_ISDIR(st.st_mode):
                why = f"{at} is {kind_of(st.st_mode)}"
            else:
                why = f"{at} cannot be opened ({e.strerror})"
            sent.skip("/" + "/".join(parts), why)
            return None
        os.close(fd)
        fd = inner
    return fd


def _folder_entry_problem(started: float | None, st: os.stat_result | None) -> str | None:
    """Why a run folder or Ray session name found in its root is not walked (None: it is, if in the window)."""
    if started is None:
        return "its time stamp is no valid time"
    if st is None:
        return "vanished while gathered"
    return None if stat.S_ISDIR(st.st_mode) else kind_of(st.st_mode)


def _run_folders(window: RunWindow, root_fd: int, roots: Roots, sent: Sent) -> Iterator[Source]:
    log_fd = _root(root_fd, roots.log_dir, sent)
    if log_fd is None:
        return
    try:
        for name in _entries(log_fd):
            m = RUN_FOLDER.fullmatch(name)
            if not m or m["name"] != window.name:
                continue  # not a run folder of this profile: not this run's, not listed
            path = "/" + "/".join((*roots.log_dir, name))
            started = stamp_time(m["stamp"], "%Y%m%d-%H%M%S")
            st = _lstat(log_fd, name)
            problem = _folder_entry_problem(started, st)
            if problem:
                sent.skip(path, problem)
                continue
            if window.holds(started):  # type: ignore[arg-type]
                fd = _open_child(log_fd, name, st, path, sent)
                if fd is not None:
                    sent.part("run", name)
                    try:
                        yield from _walk(fd, path, f"run/{name}", sent)
                    finally:
                        os.close(fd)
    finally:
        os.close(log_fd)


def _ray_sessions(window: RunWindow, root_fd: int, roots: Roots, sent: Sent) -> Iterator[Source]:
    ray_fd = _root(root_fd, roots.ray_dir, sent)
    if ray_fd is None:
        return
    try:
        for name in _entries(ray_fd):
            m = RAY_SESSION.fullmatch(name)  # session_latest is a link, and no session name: never looked at
            if not m:
                continue
            path = "/" + "/".join((*roots.ray_dir, name))
            started = stamp_time(m["stamp"], "%Y-%m-%d_%H-%M-%S")
            st = _lstat(ray_fd, name)
            problem = _folder_entry_problem(started, st)
            if problem:
                sent.skip(path, problem)
                continue
            if not window.holds(started):  # type: ignore[arg-type]
                continue
            session_fd = _open_child(ray_fd, name, st, path, sent)
            if session_fd is None:
                continue
            try:
                logs_st = _lstat(session_fd, "logs")
                if logs_st is None or not stat.S_ISDIR(logs_st.st_mode):
                    sent.skip(f"{path}/logs", "no logs folder" if logs_st is None else kind_of(logs_st.st_mode))
                    continue
                logs_fd = _open_child(session_fd, "logs", logs_st, f"{path}/logs", sent)
                if logs_fd is None:
                    continue
                sent.part("ray", name)
                try:
                    yield from _walk(logs_fd, f"{path}/logs", f"ray/{name}/logs", sent)
                finally:
                    os.close(logs_fd)
            finally:
                os.close(session_fd)
    finally:
        os.close(ray_fd)


def _flight_dumps(window: RunWindow, root_fd: int, roots: Roots, sent: Sent) -> Iterator[Source]:
    since = window.start - window.window_s
    dump_fd = _root(root_fd, roots.flight_dir, sent)
    if dump_fd is None:
        return
    try:
        for name in _entries(dump_fd):
            if not name.startswith(roots.flight_prefix):
                continue
            path = "/" + "/".join((*roots.flight_dir, shown(name)))
            st = _lstat(dump_fd, name)
            problem = name_problem(name) or (None if st is None or stat.S_ISREG(st.st_mode) else kind_of(st.st_mode))
            if problem or st is None:
                sent.skip(path, problem or "vanished while gathered")
            elif st.st_mtime >= since:
                yield Source(dump_fd, name, f"flight_recorder/{name}", path, st, "flight_recorder")
    finally:
        os.close(dump_fd)


def _ascend_logs(window: RunWindow, root_fd: int, roots: Roots, sent: Sent) -> Iterator[Source]:
    since = window.start - window.window_s
    ascend_fd = _root(root_fd, roots.ascend_dir, sent)
    if ascend_fd is None:
        return
    try:
        for source in _walk(ascend_fd, "/" + "/".join(roots.ascend_dir), "ascend", sent):
            if source.listed.st_mtime >= since:
                yield dataclasses.replace(source, section="ascend")
    finally:
        os.close(ascend_fd)


def collect(window: RunWindow, root_fd: int, roots: Roots, sent: Sent) -> Iterator[Source]:
    """Every regular file of this node that belongs to the run, listed (each is opened by `add`)."""
    yield from _run_folders(window, root_fd, roots, sent)
    yield from _ray_sessions(window, root_fd, roots, sent)
    yield from _flight_dumps(window, root_fd, roots, sent)
    yield from _ascend_logs(window, root_fd, roots, sent)


class _Exactly(io.RawIOBase):
    """`size` bytes of an open file from `offset`: a file that shrank or failed while read is padded with NULs
    (tar needs the size it announced), one that grew is cut."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self.fd, self.left, self.failed = fd, size, ""
        os.lseek(fd, offset, os.SEEK_SET)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        n = min(len(buf), self.left, _CHUNK)
        if n <= 0:
            return 0
        try:
            data = b"" if self.failed else os.read(self.fd, n)
        except OSError as e:
            self.failed, data = e.strerror or str(e), b""
        data = data or b"\0" * n
        buf[: len(data)] = data
        self.left -= len(data)
        return len(data)


def add(tar: tarfile.TarFile, source: Source, max_bytes: int, budget_left: int, sent: Sent) -> None:
    """Send one listed file, proven through the descriptor it is read from (see the module docstring)."""
    try:
        fd = os.open(source.name, _FILE_OPEN, dir_fd=source.dir_fd)
    except OSError as e:
        loop = e.errno == errno.ELOOP
        sent.skip(
            source.path,
            "replaced by a symbolic link while gathered (not followed)" if loop else f"unreadable ({e.strerror})",
        )
        return
    try:
        st = os.fstat(fd)
        problem = None if stat.S_ISREG(st.st_mode) else f"replaced while gathered by {kind_of(st.st_mode)}"
        problem = problem or _ownership_problem(st, source.listed)
        if not problem and st.st_nlink != 1:
            problem = f"{st.st_nlink} hard links: it may be a file of another folder (not sent)"
        if problem:
            sent.skip(source.path, problem)
            return
        size = min(st.st_size, max_bytes, budget_left)
        if size < st.st_size:
            sent.truncated.append(f"{source.member}: last {size} of {st.st_size} bytes")
        info = tarfile.TarInfo(source.member)
        info.size, info.mtime, info.mode = size, int(st.st_mtime), stat.S_IMODE(st.st_mode) & 0o777
        reader = _Exactly(fd, st.st_size - size, size)
        tar.addfile(info, io.BufferedReader(reader))
        if reader.failed:
            sent.skip(source.path, f"read failed part way ({reader.failed}); the rest was sent as NUL bytes")
        sent.files += 1
        sent.bytes += size
        if source.section:
            sent.part(source.section, source.member.split("/", 1)[1])
    finally:
        os.close(fd)


def write_stream(out: IO[bytes], args: argparse.Namespace) -> Sent:
    window = run_window(args.run_dir, args.window_s)
    roots = roots_of(args)
    try:
        root_fd = os.open(args.node_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise NodeLogsError(f"--node-root {shown(args.node_root)}: {e.strerror}") from None
    deadline = time.monotonic() + args.deadline_s
    budget = int(args.max_node_gib * (1 << 30))
    sent = Sent()
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            sources = collect(window, root_fd, roots, sent)
            try:
                for source in sources:
                    if time.monotonic() > deadline:
                        sent.stopped = f"--deadline-s {args.deadline_s:g} reached; the rest was not looked at"
                        break
                    if sent.bytes >= budget:
                        sent.skip(source.path, f"over --max-node-gib {args.max_node_gib:g}")
                        continue
                    add(tar, source, int(args.max_file_mib * (1 << 20)), budget - sent.bytes, sent)
            finally:
                sources.close()  # closes the descriptors of the folders it was in
            manifest = json.dumps(
                {
                    "host": socket.gethostname(),
                    "window": {"profile": window.name, "start": window.start, "window_s": window.window_s},
                    "files": sent.files,
                    "bytes": sent.bytes,
                    "parts": sent.parts,
                    "skipped": sent.skipped,
                    "truncated": sent.truncated,
                    "not_listed": sent.not_listed,
                    "stopped": sent.stopped,
                },
                indent=1,
            ).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(manifest), int(time.time()), 0o600
            tar.addfile(info, io.BytesIO(manifest))
    finally:
        os.close(root_fd)
    return sent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m verl_patches.launch.cluster.node_logs", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("--run-dir", required=True, help="the head's run folder, LOG_DIR/<profile>-<time>-head-<host>")
    p.add_argument(
        "--window-s", type=float_arg(0, 10**7), default=1800.0, help="how far from the head's start a node's run began"
    )
    p.add_argument("--ray-dir", default=os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray"))
    p.add_argument("--flight-recorder-prefix", default=FLIGHT_RECORDER_FILE)
    p.add_argument("--ascend-log-dir", default=os.environ.get("ASCEND_PROCESS_LOG_PATH", "~/ascend/log"))
    p.add_argument("--max-file-mib", type=float_arg(0, 1 << 20), default=256.0)
    p.add_argument("--max-node-gib", type=float_arg(0, 1 << 16), default=16.0)
    p.add_argument("--deadline-s", type=float_arg(0, 10**7), default=3600.0, help="stop sending files after this")
    p.add_argument("--node-root", default="/", help="read the node's files under this folder instead of /")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        write_stream(sys.stdout.buffer, args)
        sys.stdout.buffer.flush()
    except NodeLogsError as e:
        print(f"node_logs: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the gathering side stopped reading (its time-out): nothing left to tell it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
