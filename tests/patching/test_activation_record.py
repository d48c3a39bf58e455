"""Each process that activates the overlay leaves its own record when the launcher asks for one, so the
evidence that the prelude ran in a process does not depend on console logs (Ray folds repeated lines)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from verl_patches.base import cpu_numerics
from verl_patches.patching.activation_record import ACTIVATION_DIR_ENV, read_records

REPO = Path(__file__).resolve().parents[2]


def _activate(folder: Path, n: int, **extra: str) -> list[int]:
    env = {**os.environ, "PYTHONPATH": str(REPO), ACTIVATION_DIR_ENV: str(folder), "VERL_PATCHES_QUIET": "1", **extra}
    code = "import os, verl_patches.prelude_patch; verl_patches.prelude_patch.activate(); print(os.getpid())"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
        for _ in range(n)
    ]
    return [int(p.communicate(timeout=120)[0].strip()) for p in procs]


def test_every_activating_process_writes_one_record_even_with_identical_console_lines(tmp_path: Path) -> None:
    pids = _activate(tmp_path / "activations", 3, OMP_NUM_THREADS="3")  # quiet: no console line at all
    records = read_records(tmp_path / "activations")
    assert sorted(r["pid"] for r in records) == sorted(pids)  # one each, activate() twice changes nothing
    for r in records:
        assert r["summary"].startswith(f"verl_patches active in pid {r['pid']} (device=cpu)")
        assert r["patches"]["vllm.general_plugins_at_import"] == "pending"  # vllm not imported in these processes
        assert r["cpu_numerics"]["OMP_NUM_THREADS"] == "3"  # what the process ran under, as it saw it
        assert set(r["cpu_numerics"]) == set(cpu_numerics.PINS)
    assert not list((tmp_path / "activations").glob(".activation.*"))  # no temp file left


def test_no_folder_no_record_and_an_unwritable_folder_is_said_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = {**os.environ, "PYTHONPATH": str(REPO), ACTIVATION_DIR_ENV: str(blocker / "sub"), "VERL_PATCHES_QUIET": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", "import verl_patches.prelude_patch; print('alive')"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stdout.strip() == "alive" and "could not write the activation record" in proc.stderr
