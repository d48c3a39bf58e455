"""One node's side of `gather_logs`: this node's logs of one run, written to stdout as a tar stream.

What belongs to the run (the head's run folder, e.g. ``logs/a3_256die_true_weight-20250701-134002-head-a3-node-01``,
gives the profile and the start time; the other nodes started within WAIT_TIMEOUT_S of it):
  * ``run/<folder>/``: the launcher's run folders of that profile on this node started within the window
    (launcher.log with the hang report as its last line, trainer.log, ray.log, pids.json, ...);
  * ``ray/<session>/logs/``: Ray's sessions started within the window (every worker's stdout/stderr, raylet);
  * ``flight_recorder/``: torch_npu's HCCL flight-recorder dumps (``<prefix><rank>`` and ``..._py_traceback``)
    written since the window opened;
  * ``ascend/``: CANN's logs (plog, device logs) written since then.
Only regular files are sent, read without following a symbolic link (a link is listed as skipped, never
followed out of its folder); a file over --max-file-mib is cut to its last MiB (the end is what explains a
failure). ``gather_manifest.json``, the last member, lists what was sent and skipped.

    python -m verl_patches.launch.node_logs --run-dir LOG_DIR/<head run folder> [--window-s S] > node.tar
"""

from __future__ import annotations

import argparse
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
from pathlib import Path
from typing import IO

from verl_patches.launch.job_env import FLIGHT_RECORDER_FILE

RUN_FOLDER = re.compile(r"^(?P<name>[A-Za-z0-9_.]+)-(?P<stamp>\d{8}-\d{6})-(?P<role>head|worker|local)-.+$")
RAY_SESSION = re.compile(r"^session_(?P<stamp>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})_\d+_\d+$")
MANIFEST = "gather_manifest.json"
_CHUNK = 1 << 20


class NodeLogsError(ValueError):
    """The run folder's name or a path option cannot be used; one line naming it."""


@dataclass(frozen=True)
class RunWindow:
    name: str  # the profile (or "tiny")
    start: float  # the head's start, seconds since the epoch (local time of the nodes, as the folder names are)
    window_s: float

    def holds(self, t: float) -> bool:
        return abs(t - self.start) <= self.window_s


def run_window(run_dir: str, window_s: float) -> RunWindow:
    m = RUN_FOLDER.match(Path(run_dir).name)
    if not m:
        raise NodeLogsError(
            f"--run-dir {run_dir}: not a run folder of the launcher (<profile>-<YYYYmmdd>-<HHMMSS>-<role>-<host>)"
        )
    return RunWindow(m["name"], time.mktime(time.strptime(m["stamp"], "%Y%m%d-%H%M%S")), window_s)


@dataclass
class Sent:
    files: int = 0
    bytes: int = 0
    parts: dict[str, list[str]] = field(default_factory=dict)  # section -> folders or files sent
    skipped: list[dict[str, str]] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)


def _regular_files(top: Path, arc: str, sent: Sent) -> Iterator[tuple[Path, str, os.stat_result]]:
    """Regular files under `top` (never through a link), with their member names under `arc`."""
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        here = Path(dirpath)
        rel = here.relative_to(top).as_posix()
        for d in list(dirnames):
            if (here / d).is_symlink():
                dirnames.remove(d)
                sent.skipped.append({"path": str(here / d), "why": "a symbolic link (not followed)"})
        for name in sorted(filenames):
            path = here / name
            try:
                st = os.lstat(path)
            except OSError as e:
                sent.skipped.append({"path": str(path), "why": f"unreadable ({e.strerror})"})
                continue
            if not stat.S_ISREG(st.st_mode):
                why = "a symbolic link (not followed)" if stat.S_ISLNK(st.st_mode) else "not a regular file"
                sent.skipped.append({"path": str(path), "why": why})
                continue
            yield path, f"{arc}/{name}" if rel == "." else f"{arc}/{rel}/{name}", st


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        return sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return []


def collect(
    window: RunWindow, log_dir: Path, ray_dir: Path, flight_prefix: Path, ascend_dir: Path, sent: Sent
) -> Iterator[tuple[Path, str, os.stat_result]]:
    """Every file of this node that belongs to the run, with its member name."""
    for e in _entries(log_dir):
        m = RUN_FOLDER.match(e.name)
        if m and m["name"] == window.name and e.is_dir(follow_symlinks=False):
            if window.holds(time.mktime(time.strptime(m["stamp"], "%Y%m%d-%H%M%S"))):
                sent.parts.setdefault("run", []).append(e.name)
                yield from _regular_files(Path(e.path), f"run/{e.name}", sent)
    for e in _entries(ray_dir):
        m = RAY_SESSION.match(e.name)
        if m and e.is_dir(follow_symlinks=False):  # session_latest is a link: never followed
            if window.holds(time.mktime(time.strptime(m["stamp"], "%Y-%m-%d_%H-%M-%S"))):
                logs = Path(e.path) / "logs"
                if logs.is_dir() and not logs.is_symlink():
                    sent.parts.setdefault("ray", []).append(e.name)
                    yield from _regular_files(logs, f"ray/{e.name}/logs", sent)
    since = window.start - window.window_s
    for e in _entries(flight_prefix.parent):
        if e.name.startswith(flight_prefix.name) and e.is_file(follow_symlinks=False):
            st = e.stat(follow_symlinks=False)
            if st.st_mtime >= since:
                sent.parts.setdefault("flight_recorder", []).append(e.name)
                yield Path(e.path), f"flight_recorder/{e.name}", st
    if ascend_dir.is_dir() and not ascend_dir.is_symlink():
        for path, name, st in _regular_files(ascend_dir, "ascend", sent):
            if st.st_mtime >= since:
                sent.parts.setdefault("ascend", []).append(name)
                yield path, name, st


class _Exactly(io.RawIOBase):
    """`size` bytes of an open file from `offset`: a file that shrank while read is padded with NULs (tar needs
    the size it announced), one that grew is cut."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self.fd, self.left = fd, size
        os.lseek(fd, offset, os.SEEK_SET)

    def readable(self) -> bool:
        return True

    def readinto(self, buf: memoryview) -> int:  # type: ignore[override]
        n = min(len(buf), self.left, _CHUNK)
        if n <= 0:
            return 0
        data = os.read(self.fd, n) or b"\0" * n
        buf[: len(data)] = data
        self.left -= len(data)
        return len(data)


def _add(tar: tarfile.TarFile, path: Path, name: str, max_bytes: int, sent: Sent) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        sent.skipped.append({"path": str(path), "why": f"unreadable ({e.strerror})"})
        return
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced between the walk and the open
            sent.skipped.append({"path": str(path), "why": "not a regular file"})
            return
        size = min(st.st_size, max_bytes)
        if size < st.st_size:
            sent.truncated.append(f"{name}: last {size} of {st.st_size} bytes")
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode = size, int(st.st_mtime), 0o644
        tar.addfile(info, io.BufferedReader(_Exactly(fd, st.st_size - size, size)))
        sent.files += 1
        sent.bytes += size
    finally:
        os.close(fd)


def rooted(root: Path, path: Path) -> Path:
    """`path` read under `root` (`/` on a live node; a dead node's disk mounted elsewhere; a test's fake node)."""
    return root / path.relative_to(path.anchor) if path.is_absolute() else root / path


def write_stream(out: IO[bytes], args: argparse.Namespace) -> Sent:
    root = Path(args.node_root)
    window = run_window(args.run_dir, args.window_s)
    run_dir = Path(args.run_dir)
    sent = Sent()
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        sources = collect(
            window,
            rooted(root, run_dir.parent),
            rooted(root, Path(args.ray_dir)),
            rooted(root, Path(args.flight_recorder_prefix)),
            rooted(root, Path(args.ascend_log_dir).expanduser()),
            sent,
        )
        budget = int(args.max_node_gib * (1 << 30))
        for path, name, _ in sources:
            if sent.bytes >= budget:
                sent.skipped.append({"path": str(path), "why": f"over --max-node-gib {args.max_node_gib:g}"})
                continue
            _add(tar, path, name, int(args.max_file_mib * (1 << 20)), sent)
        manifest = json.dumps(
            {
                "host": socket.gethostname(),
                "window": {"profile": window.name, "start": window.start, "window_s": window.window_s},
                "files": sent.files,
                "bytes": sent.bytes,
                "parts": sent.parts,
                "skipped": sent.skipped,
                "truncated": sent.truncated,
            },
            indent=1,
        ).encode()
        info = tarfile.TarInfo(MANIFEST)
        info.size, info.mtime = len(manifest), int(time.time())
        tar.addfile(info, io.BytesIO(manifest))
    return sent


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m verl_patches.launch.node_logs", description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir", required=True, help="the head's run folder, LOG_DIR/<profile>-<time>-head-<host>")
    p.add_argument("--window-s", type=float, default=1800.0, help="how far from the head's start a node's run began")
    p.add_argument("--ray-dir", default=os.path.join(os.environ.get("RAY_TMPDIR", "/tmp"), "ray"))
    p.add_argument("--flight-recorder-prefix", default=FLIGHT_RECORDER_FILE)
    p.add_argument("--ascend-log-dir", default=os.environ.get("ASCEND_PROCESS_LOG_PATH", "~/ascend/log"))
    p.add_argument("--max-file-mib", type=float, default=256.0)
    p.add_argument("--max-node-gib", type=float, default=16.0)
    p.add_argument("--node-root", default="/", help="read the node's files under this folder instead of /")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        write_stream(sys.stdout.buffer, args)
    except NodeLogsError as e:
        print(f"node_logs: {e}", file=sys.stderr)
        return 2
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
