"""requirements.txt (A3 pins) agrees with what the locked components declare; the CPU files agree with each other.

The components' own requirement lists are read from the pristine artifacts in the download cache (the
verl wheel's METADATA, the vLLM and vllm-ascend sdists, the MindSpeed git objects). A component whose
artifact is not in this machine's cache is skipped with the reason; nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from sources_testlib import REAL_USER_CACHE, REPO_ROOT
from verl_patches.sources.lock import load_lock

LOCK = load_lock(REPO_ROOT / "sources.lock")

# Where two components disagree, requirements.txt follows the stack that actually runs (verl + vLLM +
# vllm-ascend) and says why next to the pin. Each entry must still be a real conflict: a stale entry fails.
KNOWN_CONFLICTS = {
    ("mindspeed", "tokenizers"): "MindSpeed <=0.20.3 vs vLLM 0.9.1 >=0.21.1",
    ("mindspeed_llm", "transformers"): "MindSpeed-LLM ==4.43.2 is too old for vLLM 0.9.1 (>=4.51.1)",
    ("mindspeed_llm", "ray"): "MindSpeed-LLM ==2.10.0 is for its own RL trainer; verl needs >=2.41",
    ("mindspeed_llm", "peft"): "MindSpeed-LLM ==0.7.1 predates the transformers this stack needs",
}


def _lines(text: str):
    """(line number, requirement text, comment) of each requirement line; options and blanks skipped."""
    for n, raw in enumerate(text.splitlines(), 1):
        body, _, comment = raw.partition("#")
        body = body.strip()
        if body and not body.startswith("-"):
            yield n, body, comment.strip()


def parse_pins(path: Path) -> dict[str, tuple[Version, str]]:
    """name -> (pinned version, the comment on its line); every line must be an exact pin."""
    pins = {}
    for n, body, comment in _lines(path.read_text()):
        req = Requirement(body)
        exact = [s for s in req.specifier if s.operator == "=="]
        assert len(exact) == 1 and len(req.specifier) == 1, f"{path.name}:{n}: '{body}' is not an exact pin"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}:{n}: {req.name} pinned twice"
        pins[name] = (Version(exact[0].version), comment)
    return pins


def marker_env(python: str) -> dict[str, str]:
    env = default_environment()
    env.update(
        platform_machine="aarch64",
        sys_platform="linux",
        platform_system="Linux",
        os_name="posix",
        python_version=python,
        python_full_version=f"{python}.0",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


# --------------------------------------------------------------------------- declared requirements


def _cached_artifact(component: str) -> Path:
    art = LOCK.components[component].pypi
    path = REAL_USER_CACHE / "pypi" / art.file
    if not path.exists():
        pytest.skip(f"{art.file} not in the download cache {path.parent} (run setup_sources.sh --route pypi)")
    if hashlib.sha256(path.read_bytes()).hexdigest() != art.sha256:
        pytest.skip(f"{path} does not match the lock's sha256; not trusted")
    return path


def _from_sdist(component: str, member: str) -> list[str]:
    with tarfile.open(_cached_artifact(component)) as t:
        return [body for _, body, _ in _lines(t.extractfile(member).read().decode())]


def _from_wheel_metadata(component: str) -> list[str]:
    art = LOCK.components[component].pypi
    with zipfile.ZipFile(_cached_artifact(component)) as z:
        meta = z.read(f"{art.name}-{art.version}.dist-info/METADATA").decode()
    return Parser().parsestr(meta).get_all("Requires-Dist") or []


def _from_git(component: str, path: str) -> list[str]:
    comp = LOCK.components[component]
    git_dir = REAL_USER_CACHE / "git" / f"{component}.git"
    proc = subprocess.run(
        ["git", "--git-dir", str(git_dir), "show", f"{comp.commit}:{path}"], capture_output=True, text=True
    )
    if proc.returncode:
        pytest.skip(
            f"{component} @ {comp.commit[:12]} not in the git cache {git_dir}: its requirements.txt sits "
            f"outside the package folder, so an exported cache (which carries the package folder only) "
            f"cannot supply it; this check needs git access once"
        )
    return [body for _, body, _ in _lines(proc.stdout)]


DECLARED = {
    "verl": lambda: _from_wheel_metadata("verl"),
    "vllm": lambda: _from_sdist("vllm", "vllm-0.9.1/requirements/common.txt"),
    "vllm_ascend": lambda: _from_sdist("vllm_ascend", "vllm_ascend-0.9.1/requirements.txt"),
    "mindspeed": lambda: _from_git("mindspeed", "requirements.txt"),
    "mindspeed_llm": lambda: _from_git("mindspeed_llm", "requirements.txt"),
}


def conflicts_with_pins(declared: list[str], pins: dict, env: dict) -> tuple[dict[str, str], int]:
    """(name -> 'pin vs specifier' for each pin outside a declared specifier, number of checks made)."""
    found, checked = {}, 0
    for text in declared:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue  # not machine-readable (none today)
        if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name not in pins:
            continue
        checked += 1
        if not req.specifier.contains(pins[name][0], prereleases=True):
            found[name] = f"requirements.txt {name}=={pins[name][0]} vs declared '{text}'"
    return found, checked


@pytest.mark.parametrize("python", ["3.10", "3.11"])
@pytest.mark.parametrize("component", sorted(DECLARED))
def test_a3_pins_satisfy_what_each_component_declares(component, python):
    pins = parse_pins(REPO_ROOT / "requirements.txt")
    declared = DECLARED[component]()
    assert declared, f"{component}: no declared requirements read"
    found, checked = conflicts_with_pins(declared, pins, marker_env(python))
    assert checked >= 5, f"{component}: only {checked} declared requirements matched a pin"
    allowed = {name for (comp, name) in KNOWN_CONFLICTS if comp == component}
    unexpected = {n: why for n, why in found.items() if n not in allowed}
    assert not unexpected, f"{component} (python {python}): " + "; ".join(unexpected.values())
    stale = allowed - set(found)
    assert not stale, f"KNOWN_CONFLICTS entries for {component} that no longer conflict: {sorted(stale)}"


def test_every_known_conflict_is_explained_next_to_its_pin():
    pins = parse_pins(REPO_ROOT / "requirements.txt")
    for (component, name), _ in KNOWN_CONFLICTS.items():
        comment = pins[name][1]
        who = "MindSpeed-LLM" if component == "mindspeed_llm" else "MindSpeed"
        assert who in comment, f"requirements.txt: the {name} pin does not say why it overrides {who}"


def test_a3_pins_leave_the_locked_components_to_the_lock():
    pins = parse_pins(REPO_ROOT / "requirements.txt")
    locked = {canonicalize_name(c.pypi.name) for c in LOCK.components.values() if c.pypi} | {
        "mindspeed",
        "mindspeed-llm",
    }
    assert not locked & set(pins), "requirements.txt installs a package that sources.lock provides"
    # the device stack the issue names
    assert pins["torch"][0] == Version("2.5.1") and pins["torch-npu"][0] == Version("2.5.1.post1")


# --------------------------------------------------------------------------- the CPU environment


def test_cpu_constraints_fix_every_pin_at_requirements_txt_version():
    """constraints-cpu.txt is generated from an environment built from requirements.txt; it may add
    transitive versions but never moves a pin (verl_patches.sources.pins checks this when it writes it)."""
    from verl_patches.sources.pins import NOT_ON_CPU, parse_pins, read_pins

    pins = read_pins(REPO_ROOT / "requirements.txt")
    constraints = parse_pins((REPO_ROOT / "constraints-cpu.txt").read_text(), "constraints-cpu.txt")
    problems = [
        f"{n}: requirements.txt =={p.version}, constraints-cpu.txt "
        + (f"=={constraints[n].version}" if n in constraints else "absent")
        for n, p in pins.items()
        if n not in NOT_ON_CPU and (n not in constraints or constraints[n].version != p.version)
    ]
    assert not problems, "; ".join(problems)
    assert not set(NOT_ON_CPU) & set(constraints), "constraints-cpu.txt pins a package a CPU host leaves out"
    assert not (REPO_ROOT / "requirements-cpu.txt").exists(), "a second hand-kept version list is back"


@pytest.mark.network
@pytest.mark.timeout(600)
@pytest.mark.parametrize("python", ["3.10", "3.11"])
def test_a3_requirements_resolve_together_for_linux_aarch64(python: str, tmp_path: Path) -> None:
    """Every pin of requirements.txt installs together on an A3 host (aarch64, this Python), wheels or
    sdists as PyPI has them: resolved for that platform by uv, which (unlike pip) evaluates markers for it."""
    import shutil
    import subprocess
    import sys

    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (requirements-test.txt installs it)")
    out = tmp_path / "resolved.txt"
    proc = subprocess.run(
        [
            uv,
            "pip",
            "compile",
            str(REPO_ROOT / "requirements.txt"),
            "--python-platform",
            "aarch64-manylinux_2_28",
            "--python-version",
            python,
            "--no-header",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=580,
    )
    if proc.returncode and ("Failed to fetch" in proc.stderr or "dns error" in proc.stderr.lower()):
        pytest.skip(f"package index unreachable: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stderr
    resolved = dict(
        line.split("==", 1) for line in out.read_text().splitlines() if "==" in line and not line.startswith("#")
    )
    for name, version in (
        ("torch", "2.5.1"),
        ("torch-npu", "2.5.1.post1"),
        ("transformers", "4.52.4"),
        ("tensordict", "0.1.2"),
    ):
        assert resolved.get(name) == version, (name, resolved.get(name))
