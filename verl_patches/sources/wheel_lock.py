"""The sha256 of every file the CPU environment installs: `requirements-cpu.lock.json`, one home for the hashes.

    python -m verl_patches.sources.wheel_lock generate [--index-url URL]   (maintainers; needs PyPI and uv)
        rewrite the lock from requirements.txt (minus NOT_ON_CPU), requirements-test.txt and constraints-cpu.txt
    python -m verl_patches.sources.wheel_lock requirements [--platform x86_64|aarch64]
        print the hash-pinned requirements of this host (or that platform): `pip install --require-hashes -r`

Which files: uv (pinned in requirements-test.txt) resolves the three input files for CPython 3.11 on each
supported platform (`PLATFORMS`: Linux x86_64 and aarch64, manylinux up to glibc 2.40) and writes a PEP 751
lock per platform (`uv pip compile --format pylock.toml`), which lists exactly the files of each pinned
version that platform can install. The lock keeps, per package, the wheels for each platform, or the sdist
where PyPI has no wheel for it (3 small pure-Python packages, built at install from the checked sdist), each
with its sha256 and the platforms it serves. A package only one platform needs (CUDA's libraries and triton:
x86_64's torch wheel depends on them) is marked with that platform.

Every route that installs (the wheel cache, online or offline: `verl_patches.sources.wheel_cache`) gives the
installer these hashes with ``--require-hashes``; a file whose sha256 is not the lock's is refused by name.
The lock must list exactly the versions the three input files pin (`stale_problems`; a test and the set-up
check it), so an edited pin without a regenerated lock stops the set-up in one line.

Standard library only (setup_cpu_env.sh runs it with the system Python); `generate` runs uv from this
interpreter's environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from verl_patches.base.atomic_write import write_text_atomically
from verl_patches.sources.pins import (
    CONSTRAINTS,
    REPO_ROOT,
    REQUIREMENTS,
    TEST_TOOLS,
    Pin,
    PinError,
    canonical,
    cpu_requirements,
    parse_pins,
    read_pins,
)

LOCK = REPO_ROOT / "requirements-cpu.lock.json"
PYTHON = "3.11"
# platform.machine() -> uv's --python-platform target (manylinux up to glibc 2.40: every wheel such a host
# may pick is in the lock, whatever its glibc)
PLATFORMS: dict[str, str] = {"x86_64": "x86_64-manylinux_2_40", "aarch64": "aarch64-manylinux_2_40"}
GENERATE_COMMAND = "python -m verl_patches.sources.wheel_lock generate"
DEFAULT_INDEX = "https://pypi.org/simple"
LOCK_KEYS = {"comment", "python", "platforms", "packages"}
PACKAGE_KEYS = {"name", "version", "requirement", "platforms", "files"}
FILE_KEYS = {"file", "sha256", "platforms"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")  # canonical (PEP 503)
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*")
# a distribution file's name: no folder, no leading dot, an archive suffix
_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.(?:whl|tar\.gz|zip)")
_REQUIREMENT = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9,._-]+\])?==(?P<version>\S+)")


class LockError(ValueError):
    """The lock (or what it is made from) is malformed or stale; one line naming the file and key."""


@dataclass(frozen=True)
class LockedFile:
    file: str  # the distribution file's name, as PyPI serves it
    sha256: str
    platforms: tuple[str, ...]  # the platforms that may install this file


@dataclass(frozen=True)
class LockedPackage:
    name: str  # canonical
    version: str
    requirement: str  # what the installer is given (extras kept: ray[default]==2.46.0)
    platforms: tuple[str, ...]  # the platforms that install it
    files: tuple[LockedFile, ...]

    def files_for(self, platform_name: str) -> tuple[LockedFile, ...]:
        return tuple(f for f in self.files if platform_name in f.platforms)


@dataclass(frozen=True)
class WheelLock:
    packages: dict[str, LockedPackage]  # canonical name -> package

    def for_platform(self, platform_name: str) -> list[LockedPackage]:
        return [p for p in self.packages.values() if platform_name in p.platforms]

    def file_index(self) -> dict[str, tuple[LockedPackage, LockedFile]]:
        return {f.file: (p, f) for p in self.packages.values() for f in p.files}


# ---- what the lock must cover ------------------------------------------------------------------------------------
def expected_pins(
    requirements: dict[str, Pin], test_tools: dict[str, Pin], constraints: dict[str, Pin]
) -> dict[str, Pin]:
    """name -> the pin the CPU environment installs: requirements.txt's (minus NOT_ON_CPU), the test tools, and
    constraints-cpu.txt's transitive versions; a name pinned twice must agree."""
    on_cpu = set(cpu_requirements(requirements))  # the requirement lines a CPU host installs
    merged: dict[str, Pin] = {}
    sources = (
        ("constraints-cpu.txt", constraints.values()),
        ("requirements-test.txt", test_tools.values()),
        ("requirements.txt", (p for p in requirements.values() if p.requirement in on_cpu)),
    )
    for source, pins in sources:
        for pin in pins:
            seen = merged.get(pin.name)
            if seen is not None and seen.version.split("+", 1)[0] != pin.version.split("+", 1)[0]:
                raise LockError(
                    f"{source}:{pin.line}: {pin.name}=={pin.version}, but another input pins {seen.version}"
                )
            # the later source's text wins: requirements.txt's keeps its extras (ray[default])
            merged[pin.name] = pin
    return merged


def read_expected_pins() -> dict[str, Pin]:
    return expected_pins(
        read_pins(REQUIREMENTS), read_pins(TEST_TOOLS), parse_pins(CONSTRAINTS.read_text("utf-8"), CONSTRAINTS.name)
    )


def stale_problems(lock: WheelLock, expected: dict[str, Pin]) -> list[str]:
    """How the lock differs from the pins it must cover (empty: it covers exactly them)."""
    problems = []
    for name, pin in sorted(expected.items()):
        locked = lock.packages.get(name)
        if locked is None:
            problems.append(f"{name}=={pin.version} is pinned but not locked")
        elif locked.version != pin.version.split("+", 1)[0]:
            problems.append(f"{name} is locked at {locked.version}, pinned at {pin.version}")
    problems += [f"{name} is locked but pinned nowhere" for name in sorted(set(lock.packages) - set(expected))]
    return problems


def check_fresh(lock: WheelLock, expected: dict[str, Pin], source: str = LOCK.name) -> None:
    problems = stale_problems(lock, expected)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise LockError(f"{source} is stale: {'; '.join(problems[:3])}{more}; regenerate it with `{GENERATE_COMMAND}`")


# ---- from uv's per-platform locks --------------------------------------------------------------------------------
def _file_name(url: str) -> str:
    return urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])


def lock_from_pylocks(pylocks: dict[str, dict], expected: dict[str, Pin]) -> WheelLock:
    """The lock from uv's PEP 751 lock of each platform (platform -> parsed pylock.toml): per package, the
    platform's wheels, or its sdist when it has none."""
    versions: dict[str, str] = {}
    files: dict[str, dict[str, tuple[str, set[str]]]] = {}  # package -> file -> (sha256, platforms)
    platforms_of: dict[str, set[str]] = {}
    for plat, pylock in sorted(pylocks.items()):
        for entry in pylock.get("packages", []):
            name, version = canonical(entry["name"]), entry["version"]
            first = versions.setdefault(name, version)
            if first != version:
                where = sorted(platforms_of[name])[0]
                raise LockError(f"{name}: resolved to {first} on {where} and {version} on {plat}")
            chosen = entry.get("wheels") or ([entry["sdist"]] if "sdist" in entry else [])
            if not chosen:
                raise LockError(f"{name}=={version}: no file for {plat} (neither a wheel nor an sdist)")
            for artifact in chosen:
                sha = artifact.get("hashes", {}).get("sha256", "")
                file = _file_name(artifact["url"])
                known = files.setdefault(name, {}).setdefault(file, (sha, set()))
                if known[0] != sha:
                    raise LockError(f"{file}: two sha256 for one file ({known[0]}, {sha})")
                known[1].add(plat)
            platforms_of.setdefault(name, set()).add(plat)
    packages = {}
    for name in sorted(versions):
        pin = expected.get(name)
        requirement = pin.requirement if pin is not None else f"{name}=={versions[name]}"
        packages[name] = LockedPackage(
            name=name,
            version=versions[name],
            requirement=requirement,
            platforms=tuple(sorted(platforms_of[name])),
            files=tuple(
                LockedFile(file, sha, tuple(sorted(plats))) for file, (sha, plats) in sorted(files[name].items())
            ),
        )
    lock = WheelLock(packages)
    _validate(lock, "the generated lock")
    return lock


# ---- the file ----------------------------------------------------------------------------------------------------
def lock_text(lock: WheelLock) -> str:
    """The lock as JSON, one line per package and per file (reviewable diffs)."""
    head = {
        "comment": f"Generated by `{GENERATE_COMMAND}` from requirements.txt, requirements-test.txt and "
        "constraints-cpu.txt: PyPI's files for CPython 3.11 on Linux x86_64 and aarch64 with their sha256. "
        "Do not edit by hand.",
        "python": PYTHON,
        "platforms": sorted(PLATFORMS),
    }
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()] + [' "packages": [']
    for i, p in enumerate(lock.packages.values()):
        fields = {"name": p.name, "version": p.version, "requirement": p.requirement, "platforms": list(p.platforms)}
        lines.append(f"  {json.dumps(fields)[:-1]}, \"files\": [")
        files = [json.dumps({"file": f.file, "sha256": f.sha256, "platforms": list(f.platforms)}) for f in p.files]
        lines += [f"   {text}{',' if j < len(files) - 1 else ''}" for j, text in enumerate(files)]
        lines.append("  ]}" + ("," if i < len(lock.packages) - 1 else ""))
    return "\n".join([*lines, " ]", "}"]) + "\n"


def _keys(obj: object, keys: set[str], where: str) -> dict:
    if not isinstance(obj, dict):
        raise LockError(f"{where}: expected an object")
    if set(obj) != keys:
        raise LockError(f"{where}: keys {sorted(obj)}, expected {sorted(keys)}")
    return obj


def _platforms(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v in PLATFORMS for v in value):
        raise LockError(f"{where}: expected a non-empty list of {sorted(PLATFORMS)}")
    if len(set(value)) != len(value):
        raise LockError(f"{where}: a platform listed twice")
    return tuple(value)


def parse_lock(text: str, source: str = LOCK.name) -> WheelLock:
    """The lock from its text; LockError naming the file and the key at fault."""
    try:
        data = json.loads(text)
    except ValueError as err:
        raise LockError(f"{source}: not valid JSON ({err})") from None
    data = _keys(data, LOCK_KEYS, source)
    if data["python"] != PYTHON:
        raise LockError(f"{source}: key 'python': {data['python']!r}; this code installs CPython {PYTHON}")
    _platforms(data["platforms"], f"{source}: key 'platforms'")
    if not isinstance(data["packages"], list):
        raise LockError(f"{source}: key 'packages': expected a list")
    packages: dict[str, LockedPackage] = {}
    for i, raw in enumerate(data["packages"]):
        where = f"{source}: packages[{i}]"
        raw = _keys(raw, PACKAGE_KEYS, where)
        name, version, requirement = raw["name"], raw["version"], raw["requirement"]
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise LockError(f"{where}: key 'name': {name!r} is not a canonical package name")
        where = f"{source}: packages[{i}] ({name})"
        if not isinstance(version, str) or not _VERSION.fullmatch(version):
            raise LockError(f"{where}: key 'version': {version!r} is not a version")
        m = _REQUIREMENT.fullmatch(requirement) if isinstance(requirement, str) else None
        if m is None or canonical(m["name"]) != name or m["version"] != version:
            raise LockError(f"{where}: key 'requirement': {requirement!r} is not {name}[extras]=={version}")
        if name in packages:
            raise LockError(f"{where}: {name} is locked twice")
        if not isinstance(raw["files"], list) or not raw["files"]:
            raise LockError(f"{where}: key 'files': expected a non-empty list")
        files = []
        for j, rawf in enumerate(raw["files"]):
            fwhere = f"{where}: files[{j}]"
            rawf = _keys(rawf, FILE_KEYS, fwhere)
            if not isinstance(rawf["file"], str) or not _FILE.fullmatch(rawf["file"]) or ".." in rawf["file"]:
                raise LockError(f"{fwhere}: key 'file': {rawf['file']!r} is not a wheel or sdist file name")
            if not isinstance(rawf["sha256"], str) or not _SHA256.fullmatch(rawf["sha256"]):
                raise LockError(f"{fwhere}: key 'sha256': expected 64 lower-case hex digits")
            files.append(
                LockedFile(rawf["file"], rawf["sha256"], _platforms(rawf["platforms"], f"{fwhere}: key 'platforms'"))
            )
        packages[name] = LockedPackage(
            name, version, requirement, _platforms(raw["platforms"], f"{where}: key 'platforms'"), tuple(files)
        )
    lock = WheelLock(packages)
    _validate(lock, source)
    return lock


def _validate(lock: WheelLock, source: str) -> None:
    seen: dict[str, str] = {}
    for p in lock.packages.values():
        for f in p.files:
            if f.file in seen:
                raise LockError(f"{source}: {f.file} is listed under {seen[f.file]} and {p.name}")
            seen[f.file] = p.name
            if not canonical(f.file.split("-", 1)[0]).startswith(p.name.split("-", 1)[0]):
                raise LockError(f"{source}: {p.name}: {f.file} is not a file of {p.name}")
        for plat in p.platforms:
            if not p.files_for(plat):
                raise LockError(f"{source}: {p.name}=={p.version}: no file for {plat}")


def read_lock(path: Path = LOCK) -> WheelLock:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise LockError(f"{path}: unreadable ({err})") from None
    return parse_lock(text, path.name)


def lock_sha256(path: Path = LOCK) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- what the installer is given ---------------------------------------------------------------------------------
def host_platform(machine: str | None = None, system: str | None = None) -> str:
    """This host's key of PLATFORMS; LockError naming what the lock covers otherwise."""
    machine = platform.machine() if machine is None else machine
    system = platform.system() if system is None else system
    if system != "Linux" or machine not in PLATFORMS:
        raise LockError(
            f"this host is {system} {machine}: {LOCK.name} holds PyPI's files for CPython {PYTHON} on Linux "
            f"{' and '.join(sorted(PLATFORMS))} only (the CPU environment is set up on those)"
        )
    return machine


def hashed_requirements(lock: WheelLock, platform_name: str, names: set[str] | None = None) -> str:
    """pip/uv requirements text for ``platform_name``: each package's requirement with the sha256 of every file
    that platform may install (``names``: only those packages)."""
    lines = [f"# from {LOCK.name} for Linux {platform_name}, CPython {PYTHON}: install with --require-hashes"]
    for p in lock.for_platform(platform_name):
        if names is not None and p.name not in names:
            continue
        hashes = [f"--hash=sha256:{f.sha256}" for f in p.files_for(platform_name)]
        lines.append(" \\\n    ".join([p.requirement, *hashes]))
    return "\n".join(lines) + "\n"


# ---- generate ----------------------------------------------------------------------------------------------------
def _uv() -> str:
    found = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if found is None:
        raise LockError("uv is not installed here (requirements-test.txt pins it): run setup_cpu_env.sh first")
    return found


def _toml(path: Path) -> dict:
    import tomllib  # only here: Python 3.11's, and the set-up imports this module with whatever python3 it finds

    return tomllib.loads(path.read_text(encoding="utf-8"))


def generate(index_url: str = DEFAULT_INDEX) -> WheelLock:
    """Resolve the inputs for each platform with uv and build the lock (network: the index)."""
    expected = read_expected_pins()
    pylocks: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="verl-wheel-lock-") as tmp:
        cpu = Path(tmp) / "cpu-requirements.txt"
        cpu.write_text("\n".join(cpu_requirements(read_pins(REQUIREMENTS))) + "\n", encoding="utf-8")
        for plat, target in sorted(PLATFORMS.items()):
            out = Path(tmp) / f"pylock.{plat.replace('_', '')}.toml"
            command = [_uv(), "pip", "compile", "--quiet", "--no-config", "--no-header", "--index-url", index_url]
            command += ["--python-version", PYTHON, "--python-platform", target, "--format", "pylock.toml"]
            command += ["-o", str(out), str(cpu), str(TEST_TOOLS), "-c", str(CONSTRAINTS)]
            proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                raise LockError(f"uv pip compile for {target} failed (exit {proc.returncode}): {tail[0]}")
            pylocks[plat] = _toml(out)
    lock = lock_from_pylocks(pylocks, expected)
    check_fresh(lock, expected, "the resolved lock")
    return lock


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_patches.sources.wheel_lock", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    gen = sub.add_parser("generate", help=f"rewrite {LOCK.name} (network: the index, default PyPI)")
    gen.add_argument("--index-url", default=DEFAULT_INDEX)
    req = sub.add_parser("requirements", help="print the hash-pinned requirements of this host or --platform")
    req.add_argument("--platform", choices=sorted(PLATFORMS))
    args = ap.parse_args(argv)
    try:
        if args.cmd == "generate":
            lock = generate(args.index_url)
            write_text_atomically(LOCK, lock_text(lock))
            print(f"wrote {LOCK.name}: {len(lock.packages)} packages")
            return 0
        lock = read_lock()
        check_fresh(lock, read_expected_pins())
        print(hashed_requirements(lock, args.platform or host_platform()), end="")
        return 0
    except (LockError, PinError, OSError) as err:
        print(f"wheel lock: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
