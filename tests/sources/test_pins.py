"""requirements.txt is the one source of versions: what the CPU host installs, the constraints, and the
run-time line that says which installed versions differ."""

from __future__ import annotations

import pytest

from fresh_python import fresh_python
from verl_patches.sources import pins
from verl_patches.sources.pins import (
    Difference,
    Pin,
    PinError,
    constraints_text,
    cpu_requirements,
    differences,
    parse_pins,
    read_pins,
    summary_line,
)

TEXT = """# header
torch==2.5.1
torch-npu==2.5.1.post1        # comment
ray[default]==2.46.0
Tensordict==0.1.2
--extra-index-url https://example.invalid/simple
"""


def test_parse_keeps_extras_for_pip_and_canonical_names_for_lookups():
    p = parse_pins(TEXT, "r.txt")
    assert list(p) == ["torch", "torch-npu", "ray", "tensordict"]
    assert p["ray"] == Pin("ray", "2.46.0", "ray[default]==2.46.0", 4)
    assert cpu_requirements(p) == ["torch==2.5.1", "ray[default]==2.46.0", "Tensordict==0.1.2"]


@pytest.mark.parametrize(
    "line, what",
    [("torch>=2.5", "not an exact pin"), ("torch", "not an exact pin"), ("torch==2.5.1\ntorch==2.5.2", "pinned twice")],
)
def test_a_line_that_is_not_one_exact_pin_is_refused_with_file_and_line(line, what):
    with pytest.raises(PinError, match=rf"r\.txt:\d+: .*{what}"):
        parse_pins(line, "r.txt")


def test_an_exclusion_that_requirements_txt_no_longer_pins_is_an_error():
    with pytest.raises(PinError, match="torch-npu"):
        cpu_requirements(parse_pins("torch==2.5.1\n", "r.txt"))


def test_differences_on_a_cpu_host_and_on_an_npu_host():
    p = parse_pins(TEXT, "r.txt")
    installed = {"torch": "2.13.0", "ray": "2.46.0", "tensordict": None, "torch-npu": None}
    cpu = differences(p, cpu_host=True, version_of=installed.get, emulated=lambda n: n == "torch-npu")
    assert [d.text() for d in cpu] == ["torch 2.13.0 (pinned 2.5.1)", "tensordict not installed (pinned 0.1.2)"]
    npu = differences(p, cpu_host=False, version_of=installed.get)
    assert [d.name for d in npu] == ["torch", "torch-npu", "tensordict"]
    # a local build label is the same release (PyPI's x86_64 torch 2.5.1 reports 2.5.1+cu124)
    same = {"torch": "2.5.1+cu124", "ray": "2.46.0", "tensordict": "0.1.2", "torch-npu": None}
    assert differences(p, cpu_host=True, version_of=same.get) == []
    line = summary_line(p, [], cpu_host=True)
    assert (
        line
        == "package versions: all 3 pins of requirements.txt installed as pinned; left out on a CPU host: torch-npu"
    )
    line = summary_line(p, cpu, cpu_host=True)
    assert line.startswith("package versions DIFFER from requirements.txt (2 of 4): torch 2.13.0 (pinned 2.5.1), ")
    assert "\n" not in line


def test_constraints_text_refuses_an_environment_that_is_not_requirements_txts():
    p = parse_pins(TEXT, "r.txt")
    ok = ["torch==2.5.1", "ray==2.46.0", "tensordict==0.1.2", "pip==24.0", "numpy==1.26.4", "x @ file:///tmp/x"]
    text = constraints_text(ok, p)
    assert "\nnumpy==1.26.4\n" in text and "pip==" not in text and "file://" not in text
    with pytest.raises(PinError, match="torch ==2.13.0 vs requirements.txt ==2.5.1"):
        constraints_text(["torch==2.13.0", "ray==2.46.0", "tensordict==0.1.2"], p)
    with pytest.raises(PinError, match="tensordict not installed"):
        constraints_text(["torch==2.5.1", "ray==2.46.0"], p)


def test_this_environment_has_every_pin_of_requirements_txt():
    """The suite runs on A3's package versions: any pinned package at another version fails here."""
    p = read_pins()
    found = differences(p, cpu_host=pins.host_is_cpu())
    assert found == [], summary_line(p, found, pins.host_is_cpu())
    import ray
    import tensordict
    import torch

    assert (torch.__version__.split("+")[0], ray.__version__) == (p["torch"].version, p["ray"].version)
    assert getattr(tensordict, "__version__", p["tensordict"].version) == p["tensordict"].version


def test_cli_prints_the_cpu_requirements_and_the_version_line():
    printed = fresh_python("-m", "verl_patches.sources.pins", "cpu-requirements")
    assert printed.returncode == 0, printed.stderr
    out = printed.stdout.splitlines()
    assert out == cpu_requirements(read_pins()) and not any(req.startswith("torch-npu") for req in out)
    proc = fresh_python("-m", "verl_patches.sources.pins", "check")
    assert proc.stdout.startswith("package versions: all "), proc.stdout + proc.stderr
    # and whether the packages are the hash-checked install's (tests/sources/test_wheel_cache.py plants and
    # installs tampered ones): one line each on stderr, exit 1 (an environment set up before it has no receipt)
    installed = pins.installed_problems()
    assert proc.stderr.splitlines() == [f"pins: {line}" for line in installed]
    assert proc.returncode == (1 if installed else 0), proc.stderr


def test_difference_text_names_emulation():
    assert (
        Difference("torch-npu", "2.5.1.post1", None, "is the CPU emulation").text()
        == "torch-npu is the CPU emulation (pinned 2.5.1.post1)"
    )


def test_the_audit_and_the_launcher_say_the_version_line():
    import json

    audit = fresh_python("-m", "verl_patches.audit", "--json")
    versions = json.loads(audit.stdout)["package_versions"]
    assert versions["line"] == pins.check()[0] and versions["differences"] == []
    # the launcher says it first, before its settings are even read (here an env file that is not there)
    proc = fresh_python(
        "-c",
        "import sys; from verl_patches.launch import job; "
        "sys.exit(job.main(['--profile', 'a3_256die_random_init', '--env-file', '/nonexistent']))",
        timeout=120,
    )
    assert proc.stdout.splitlines()[0] == "launch: " + pins.check()[0], proc.stdout + proc.stderr
