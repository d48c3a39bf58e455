"""requirements.txt as the one source of package versions: the CPU test environment, its constraints and
the run-time check of what is installed all derive from it.

Standard library only: `setup_cpu_env.sh` runs this with the system Python before `.venv` exists.

    python -m verl_patches.sources.pins cpu-requirements
        requirements.txt minus what cannot exist on a CPU host
    python -m verl_patches.sources.pins check
        one line: installed versions vs requirements.txt (exit 1: differ); on a CPU host also whether every
        locked package is the one the hash-checked install put there (`install_receipt`; exit 1 and one line
        on stderr for each that is not)
    python -m verl_patches.sources.pins freeze
        regenerate constraints-cpu.txt from this interpreter's packages
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from verl_patches.base.atomic_write import write_text_atomically
from verl_patches.base.host_device import DeviceSettingError, detect_host_device
from verl_patches.device import device_kind

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = REPO_ROOT / "requirements.txt"
TEST_TOOLS = REPO_ROOT / "requirements-test.txt"
CONSTRAINTS = REPO_ROOT / "constraints-cpu.txt"

# The only packages of requirements.txt a CPU host leaves out, each with its reason (README and the
# version check quote these). Everything else is installed at exactly the pinned version.
NOT_ON_CPU: dict[str, str] = {
    "torch-npu": "the Ascend extension needs CANN and an NPU driver; on a CPU host verl_patches.npu_emulation "
    "stands in for it",
}

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[A-Za-z0-9,._ -]+\])?\s*==\s*(?P<version>[A-Za-z0-9.+!_-]+)$"
)


class PinError(ValueError):
    """A requirements or constraints line that is not an exact pin; names the file and line."""


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503) name
    version: str
    requirement: str  # the line's requirement text, extras kept (what pip is given)
    line: int


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str, source: str) -> dict[str, Pin]:
    """name -> Pin for every requirement line; comments, blanks and option lines are skipped."""
    pins: dict[str, Pin] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        body = raw.split("#", 1)[0].strip()
        if not body or body.startswith("-"):
            continue
        m = _PIN.match(body)
        if m is None:
            raise PinError(f"{source}:{n}: '{body}' is not an exact pin (name==version)")
        name = canonical(m["name"])
        if name in pins:
            raise PinError(f"{source}:{n}: {m['name']} is pinned twice (first at line {pins[name].line})")
        pins[name] = Pin(name, m["version"], body, n)
    return pins


def read_pins(path: Path = REQUIREMENTS) -> dict[str, Pin]:
    return parse_pins(path.read_text(encoding="utf-8"), path.name)


def cpu_requirements(pins: dict[str, Pin]) -> list[str]:
    """The requirement lines a CPU host installs: every pin except NOT_ON_CPU."""
    unknown = sorted(set(NOT_ON_CPU) - set(pins))
    if unknown:  # a stale exclusion would silently stop meaning anything
        raise PinError(f"NOT_ON_CPU names {unknown}, which requirements.txt does not pin")
    return [p.requirement for p in pins.values() if p.name not in NOT_ON_CPU]


@dataclass(frozen=True)
class Difference:
    name: str
    pinned: str
    installed: str | None  # None: not installed
    note: str = ""

    def text(self) -> str:
        if self.note:
            return f"{self.name} {self.note} (pinned {self.pinned})"
        if self.installed is None:
            return f"{self.name} not installed (pinned {self.pinned})"
        return f"{self.name} {self.installed} (pinned {self.pinned})"


def _installed_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _same_release(installed: str, pinned: str) -> bool:
    """2.5.1+cu124 is PyPI's build of torch 2.5.1 on x86_64 (the CPU wheel on aarch64 is 2.5.1): a local
    version label names the build, not another release."""
    return installed == pinned or installed.split("+", 1)[0] == pinned


def differences(
    pins: dict[str, Pin],
    cpu_host: bool,
    version_of: Callable[[str], str | None] = _installed_version,
    emulated: Callable[[str], bool] = lambda name: False,
) -> list[Difference]:
    """Every pin whose installed version differs. On a CPU host the NOT_ON_CPU packages are expected to be
    absent (reported only when something else stands there); elsewhere their absence is a difference."""
    found: list[Difference] = []
    for pin in pins.values():
        installed = version_of(pin.name)
        if cpu_host and pin.name in NOT_ON_CPU:
            if installed is not None:
                found.append(Difference(pin.name, pin.version, installed, f"{installed} installed on a CPU host"))
            continue
        if installed is None and emulated(pin.name):
            found.append(Difference(pin.name, pin.version, None, "is the CPU emulation"))
        elif installed is None or not _same_release(installed, pin.version):
            found.append(Difference(pin.name, pin.version, installed))
    return found


def summary_line(pins: dict[str, Pin], found: list[Difference], cpu_host: bool) -> str:
    """One line for the log and the audit."""
    left_out = [n for n in NOT_ON_CPU if n in pins] if cpu_host else []
    tail = f"; left out on a CPU host: {', '.join(left_out)}" if left_out else ""
    if not found:
        return f"package versions: all {len(pins) - len(left_out)} pins of requirements.txt installed as pinned{tail}"
    return (
        f"package versions DIFFER from requirements.txt ({len(found)} of {len(pins)}): "
        + ", ".join(d.text() for d in found)
        + tail
    )


def host_is_cpu() -> bool:
    """No NPU stack here (our torch_npu emulation does not count) and no CUDA device. Without torch, which is what
    `check` exists to report, the host's device files decide (`host_device.detect_host_device`)."""
    try:
        return device_kind() == "cpu"
    except ModuleNotFoundError:
        return detect_host_device() == "cpu"


def check(path: Path = REQUIREMENTS, cpu_host: bool | None = None) -> tuple[str, list[Difference]]:
    """cpu_host None: ask torch (verl_patches.device); the audit, which must not need torch, says it."""
    pins = read_pins(path)
    cpu = host_is_cpu() if cpu_host is None else cpu_host
    found = differences(pins, cpu)
    return summary_line(pins, found, cpu), found


def constraints_text(freeze_lines: list[str], pins: dict[str, Pin]) -> str:
    """constraints-cpu.txt from `pip freeze` of an environment built from requirements.txt: every transitive
    version fixed, and every pinned package at requirements.txt's version (else PinError: the environment
    it came from is not the one requirements.txt describes)."""
    frozen: dict[str, str] = {}
    for raw in freeze_lines:
        body = raw.strip()
        if not body or body.startswith("#") or body.startswith("-e ") or " @ " in body:
            continue  # editable or local installs are not index packages
        if body.startswith("pip=="):
            continue  # the installer itself: whatever the venv came with
        m = _PIN.match(body)
        if m is None:
            continue
        frozen[canonical(m["name"])] = f"{m['name']}=={m['version']}"
    wrong = [
        f"{p.name} =={frozen[p.name].split('==', 1)[1]} vs requirements.txt =={p.version}"
        for p in pins.values()
        if p.name in frozen and not _same_release(frozen[p.name].split("==", 1)[1], p.version)
    ]
    missing = [p.name for p in pins.values() if p.name not in frozen and p.name not in NOT_ON_CPU]
    if wrong or missing:
        raise PinError(
            "this environment is not requirements.txt's: " + "; ".join(wrong + [f"{n} not installed" for n in missing])
        )
    lines = [frozen[n] for n in sorted(frozen)]
    head = (
        "# Generated by `python -m verl_patches.sources.pins freeze` in an environment built by "
        "setup_cpu_env.sh from\n# requirements.txt (+ requirements-test.txt): fixes every transitive version. "
        "Do not edit by hand.\n"
    )
    return head + "\n".join(lines) + "\n"


def installed_problems() -> list[str]:
    """How this environment differs from the hash-checked install of requirements-cpu.lock.json (one line each;
    empty: it is that install)."""
    # here, not at the top: wheel_lock and install_receipt import this module's pins
    from verl_patches.sources import install_receipt, wheel_lock

    try:
        lock = wheel_lock.read_lock()
        platform_name = wheel_lock.host_platform()
    except wheel_lock.LockError as err:
        return [str(err)]
    return install_receipt.problems(Path(sys.prefix), Path(sysconfig.get_paths()["purelib"]), lock, platform_name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m verl_patches.sources.pins", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("cpu-requirements", help="print requirements.txt's lines that a CPU host installs")
    sub.add_parser("check", help="one line: installed versions vs requirements.txt; exit 1 when they differ")
    sub.add_parser("freeze", help="rewrite constraints-cpu.txt from this interpreter's installed packages")
    args = ap.parse_args(argv)
    try:
        pins = read_pins()
        if args.cmd == "cpu-requirements":
            print("\n".join(cpu_requirements(pins)))
            return 0
        if args.cmd == "check":
            line, found = check()
            print(line)
            installed = installed_problems() if host_is_cpu() else []
            for problem in installed:
                print(f"pins: {problem}", file=sys.stderr)
            return 1 if found or installed else 0
        freeze = subprocess.run(
            [sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True, check=True
        ).stdout.splitlines()
        write_text_atomically(CONSTRAINTS, constraints_text(freeze, pins))
        print(f"wrote {CONSTRAINTS.name}")
        return 0
    except (PinError, DeviceSettingError, OSError) as e:
        print(f"pins: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
