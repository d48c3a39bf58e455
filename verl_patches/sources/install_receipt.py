"""What the hash-checked install put into an environment, and whether it is still what is there.

The wheel cache's install (`wheel_cache`) checks every file against `requirements-cpu.lock.json` before the
installer sees it. Its receipt, ``<environment>/verl-overlay-wheels.json``, records for each package it
installed the lock's sha256 of the files it was installed from and the sha256 of the distribution's RECORD
as the installer wrote it (RECORD lists every installed file with its own sha256). `problems` then tells
(`python -m verl_patches.sources.pins check` says it) whether the environment still is that install:

* every locked package of this host is installed at the lock's version, from files the lock hashes (a
  receipt of another lock counts as no receipt), and its RECORD is the one the install wrote: a package
  installed or reinstalled afterwards from anywhere else (another wheel with the pinned version's name)
  changes its RECORD and is named;
* every file that runs at each interpreter start (``*.pth``, ``sitecustomize.py``, ``usercustomize.py`` at
  the top of site-packages) is listed, with its sha256, in the RECORD of a package the receipt vouches for.

What this does not cover: an edit of an installed file that leaves RECORD alone needs write access to the
environment, which is the account's own (who has it can rewrite the receipt too); hashing every installed
file (6.5 GB) at each check would not change that.

An environment without a receipt (made before hash-checked installs, or by hand) fails the check until
setup_cpu_env.sh has installed into it, which reinstalls every package once.
"""

from __future__ import annotations

import base64
import csv
import email.parser
import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base.atomic_write import write_json_atomically
from verl_patches.sources.pins import canonical
from verl_patches.sources.wheel_lock import WheelLock

RECEIPT_NAME = "verl-overlay-wheels.json"
STARTUP_HOOKS = ("sitecustomize.py", "usercustomize.py")  # plus every *.pth
SETUP_COMMAND = "bash verl_patches/scripts/setup_cpu_env.sh"
_MAX_RECEIPT_BYTES = 1 << 20


@dataclass(frozen=True)
class InstalledDist:
    name: str  # canonical
    version: str
    record: Path  # its RECORD file


def installed_dists(site_packages: Path) -> dict[str, InstalledDist]:
    """canonical name -> the distribution installed in ``site_packages`` (its ``*.dist-info`` folders)."""
    found: dict[str, InstalledDist] = {}
    for entry in sorted(os.scandir(site_packages), key=lambda e: e.name):
        if not entry.name.endswith(".dist-info") or not entry.is_dir(follow_symlinks=False):
            continue
        try:
            head = (Path(entry.path) / "METADATA").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        fields = email.parser.HeaderParser().parsestr(head)
        name, version = fields.get("Name"), fields.get("Version")
        if name and version:
            found.setdefault(canonical(name), InstalledDist(canonical(name), version, Path(entry.path) / "RECORD"))
    return found


def _sha256_file(path: Path) -> str | None:
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            return hashlib.file_digest(fh, "sha256").hexdigest()
    except OSError:
        return None


def receipt_path(prefix: Path) -> Path:
    return prefix / RECEIPT_NAME


def read_receipt(prefix: Path) -> dict[str, dict] | None:
    """name -> {"version", "record_sha256", "files_sha256"} from the environment's receipt; None when there is
    none or it is not one this code wrote."""
    path = receipt_path(prefix)
    try:
        with open(path, "rb", opener=lambda p, f: os.open(p, f | os.O_NOFOLLOW)) as fh:
            data = json.loads(fh.read(_MAX_RECEIPT_BYTES + 1))
    except (OSError, ValueError):
        return None
    dists = data.get("dists") if isinstance(data, dict) else None
    if not isinstance(dists, dict):
        return None
    good = {}
    for name, entry in dists.items():
        if (
            isinstance(entry, dict)
            and isinstance(entry.get("version"), str)
            and isinstance(entry.get("record_sha256"), str)
            and isinstance(entry.get("files_sha256"), list)
        ):
            good[name] = entry
    return good


def _vouched(entry: dict | None, lock: WheelLock, name: str, version: str) -> bool:
    """The receipt's entry is of this version and names only files the current lock hashes for the package."""
    locked = lock.packages.get(name)
    if entry is None or locked is None or entry["version"] != version or not entry["files_sha256"]:
        return False
    return set(entry["files_sha256"]) <= {f.sha256 for f in locked.files}


def to_reinstall(prefix: Path, site_packages: Path, lock: WheelLock, platform_name: str) -> list[str] | None:
    """The locked packages whose installed copy the receipt does not vouch for (they are reinstalled from the
    checked files); None when there is no receipt (every package is reinstalled)."""
    receipt = read_receipt(prefix)
    if receipt is None:
        return None
    installed = installed_dists(site_packages)
    names = []
    for p in lock.for_platform(platform_name):
        dist = installed.get(p.name)
        if dist is None:
            continue  # not installed: the installer installs it from the checked files anyway
        entry = receipt.get(p.name)
        if not _vouched(entry, lock, p.name, dist.version) or entry["record_sha256"] != _sha256_file(dist.record):
            names.append(p.name)
    return names


def write_receipt(
    prefix: Path, site_packages: Path, lock: WheelLock, platform_name: str, staged: dict[str, list[str]]
) -> None:
    """Record what the install just put there: ``staged`` is package -> the lock sha256 of its checked files
    the installer was given."""
    installed = installed_dists(site_packages)
    dists = {}
    for p in lock.for_platform(platform_name):
        dist = installed.get(p.name)
        record = _sha256_file(dist.record) if dist is not None else None
        if dist is None or record is None or p.name not in staged:
            continue
        dists[p.name] = {"version": dist.version, "record_sha256": record, "files_sha256": sorted(staged[p.name])}
    write_json_atomically(receipt_path(prefix), {"dists": dists}, indent=1, sort_keys=True)


def _record_hashes(record: Path) -> dict[str, str]:
    """RECORD's path -> sha256 (hex) for the entries that carry one."""
    try:
        text = record.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    hashes = {}
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1].removeprefix("sha256=")
            try:
                hashes[os.path.normpath(row[0])] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
            except ValueError:
                continue
    return hashes


def problems(prefix: Path, site_packages: Path, lock: WheelLock, platform_name: str) -> list[str]:
    """One line per way the environment is not the hash-checked install (empty: it is)."""
    receipt = read_receipt(prefix)
    if receipt is None:
        return [
            f"{receipt_path(prefix)}: no receipt of a hash-checked install: the packages here were installed "
            f"without checking them against the lock; run `{SETUP_COMMAND}` (it reinstalls them from checked files)"
        ]
    installed = installed_dists(site_packages)
    found = []
    vouched: list[InstalledDist] = []
    for p in lock.for_platform(platform_name):
        dist = installed.get(p.name)
        if dist is None:
            continue  # a missing package is the version line's business
        entry = receipt.get(p.name)
        if not _vouched(entry, lock, p.name, dist.version):
            found.append(f"{p.name} {dist.version}: not installed by the hash-checked install of this lock")
        elif entry["record_sha256"] != _sha256_file(dist.record):
            found.append(
                f"{p.name} {dist.version}: {dist.record} differs from the one the hash-checked install wrote "
                "(installed again from elsewhere, or changed)"
            )
        else:
            vouched.append(dist)
    owned: dict[str, str] = {}
    for dist in vouched:
        base = dist.record.parent.parent  # the folder RECORD's paths are relative to
        for rel, sha in _record_hashes(dist.record).items():
            owned[os.path.normpath(base / rel)] = sha
    for entry in sorted(os.scandir(site_packages), key=lambda e: e.name):
        if not (entry.name.endswith(".pth") or entry.name in STARTUP_HOOKS):
            continue
        path = os.path.normpath(entry.path)
        want = owned.get(path)
        if want is None:
            found.append(f"{path}: runs at every interpreter start and no hash-checked package installed it; remove it")
        elif _sha256_file(Path(path)) != want:
            found.append(f"{path}: runs at every interpreter start and differs from its package's RECORD")
    return found
