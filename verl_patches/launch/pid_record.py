"""`pids.json` of a run folder: the processes a launch started (and the launcher itself), each by identity.

A pid alone is not an identity (`process_identity`): by the time someone stops a run, the number may belong to
another process. So each entry holds the pid and its start time (clock ticks since boot), and the record holds
the node's host name and boot id, since ticks count from a boot and pids are per node::

    {"host": "a3-node-01", "boot_id": "5d0c...", "processes": {"launcher": {"pid": 4242, "start_ticks": 91234}, ...}}

`record_text` writes it (the launcher, through its run folder's descriptor); `read_record` reads it back strictly,
each refusal one line naming the file and the key.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from verl_patches.process_identity import ProcessId, start_ticks

FILE = "pids.json"
MAX_BYTES = 1 << 16  # a handful of entries: anything bigger is not one of ours
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
BOOT_ID_FILE = Path("/proc/sys/kernel/random/boot_id")


class PidRecordError(ValueError):
    """pids.json missing, not ours or not as the launcher writes it; one line naming the file and the key."""


def boot_id() -> str:
    """This node's boot id ('' where the kernel does not say): start times count from this boot."""
    try:
        return BOOT_ID_FILE.read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True)
class PidRecord:
    host: str
    boot_id: str
    processes: dict[str, ProcessId]


def record_text(owned: dict[str, int]) -> str:
    """The pids.json text for ``owned`` (name -> pid of a live process), each with its start time read now."""
    processes = {}
    for name, pid in owned.items():
        ticks = start_ticks(pid)
        if ticks is not None:  # gone already: nothing of it is left to stop
            processes[name] = {"pid": pid, "start_ticks": ticks}
    return json.dumps({"host": socket.gethostname(), "boot_id": boot_id(), "processes": processes}, indent=2)


def _int(value: object, where: str, minimum: int) -> int:
    if type(value) is not int or value < minimum:
        raise PidRecordError(f"{where}: expected an integer >= {minimum}, got {json.dumps(value)[:40]}")
    return value


def parse_record(text: str, shown: str) -> PidRecord:
    """The record in ``text`` (``shown`` names the file in errors)."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise PidRecordError(f"{shown}: not JSON ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("processes"), dict):
        raise PidRecordError(f"{shown}: key 'processes' missing: not a record this launcher wrote")
    host, boot = data.get("host"), data.get("boot_id")
    if not isinstance(host, str) or not isinstance(boot, str):
        raise PidRecordError(f"{shown}: keys 'host' and 'boot_id' must be strings")
    processes = {}
    for name, entry in data["processes"].items():
        if not _NAME.fullmatch(name):
            raise PidRecordError(f"{shown}: process name {json.dumps(name)[:40]} is not one the launcher records")
        if not isinstance(entry, dict):
            raise PidRecordError(f"{shown}: key 'processes.{name}' must hold pid and start_ticks")
        pid = _int(entry.get("pid"), f"{shown}: key 'processes.{name}.pid'", 2)
        ticks = _int(entry.get("start_ticks"), f"{shown}: key 'processes.{name}.start_ticks'", 0)
        processes[name] = ProcessId(pid, ticks)
    return PidRecord(host, boot, processes)


def read_record(run_dir: Path) -> PidRecord:
    """``run_dir``'s pids.json: the folder must be this account's, the file a regular file in it (never a link)."""
    try:
        fd_dir = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise PidRecordError(f"{run_dir}: not a run folder ({e.strerror})") from None
    try:
        st = os.fstat(fd_dir)
        if st.st_uid != os.geteuid():
            raise PidRecordError(f"{run_dir}: owned by uid {st.st_uid}, not by you: not a run of yours to stop")
        try:
            fd = os.open(FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd_dir)
        except OSError as e:
            raise PidRecordError(f"{run_dir / FILE}: cannot open ({e.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            fst = os.fstat(f.fileno())
            if not stat.S_ISREG(fst.st_mode) or fst.st_uid != os.geteuid() or fst.st_size > MAX_BYTES:
                raise PidRecordError(f"{run_dir / FILE}: not a record the launcher wrote (a regular file of yours)")
            text = f.read(MAX_BYTES + 1).decode("utf-8", errors="replace")
    finally:
        os.close(fd_dir)
    return parse_record(text, str(run_dir / FILE))


__all__ = ["FILE", "PidRecord", "PidRecordError", "boot_id", "parse_record", "read_record", "record_text"]
