"""`python -m verl_patches.npu_emulation.catalog` (README's pointer to the catalog) prints it: every emulated op
with its implementation, reference formula and wheel ops, every feature a CPU host cannot run with its reason;
`--json` is the same as data."""

from __future__ import annotations

import json
import subprocess

from fresh_python import fresh_python
from verl_patches.npu_emulation.catalog import CPU_LIMITS, OPS, limits_table, ops_table


def run(*args: str) -> subprocess.CompletedProcess:
    return fresh_python("-m", "verl_patches.npu_emulation.catalog", *args, timeout=120)


def test_the_command_prints_every_op_and_every_cpu_limit() -> None:
    p = run()
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""  # no runpy warning: the package does not import its catalog when it loads
    text = " ".join(p.stdout.split())  # wrapped for the terminal; compared with the wrapping undone
    assert text.startswith(f"{len(OPS)} emulated torch_npu / MindSpeed operations")
    for op in OPS:
        assert f"{op.name} provider {' '.join(op.provider.split())}" in text, op.name
        assert f"implementation {op.implementation}" in text and " ".join(op.reference.split()) in text, op.name
        if op.wheel_ops:
            assert f"wheel ops {', '.join(op.wheel_ops)}" in text, op.name
    assert f"{len(CPU_LIMITS)} features that do not run on a CPU host" in text
    for lim in CPU_LIMITS:
        assert f"{' '.join(lim.feature.split())} why {' '.join(lim.reason.split())}" in text, lim.feature
    assert max(len(line) for line in p.stdout.splitlines()) <= 110


def test_json_is_the_catalog_as_data() -> None:
    p = run("--json")
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert json.loads(p.stdout) == {"emulated_ops": json.loads(json.dumps(ops_table())), "cpu_limits": limits_table()}


def test_an_unknown_option_is_usage_exit_2() -> None:
    p = run("--tabel")
    assert p.returncode == 2 and "--tabel" in p.stderr and p.stdout == ""


def test_loading_the_package_loads_nothing_of_the_report() -> None:
    """Every patched process imports the package (prelude_patch); the catalog and the wheel contract are the
    audit's, loaded when it asks."""
    code = (
        "import sys, verl_patches.npu_emulation; "
        "print(sorted(m for m in sys.modules if m.startswith('verl_patches.npu_emulation.')))"
    )
    p = fresh_python("-c", code, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", (p.stdout, p.stderr)
