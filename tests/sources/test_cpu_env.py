"""The CPU environment: from the populated root, fresh interpreters import the vendored upstream trees."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sources_testlib import REPO_ROOT

MODULES = {"verl.trainer.ppo.core_algos": "verl", "vllm": "vllm", "megatron.core": "megatron"}


def _python() -> str:
    venv = REPO_ROOT / ".venv/bin/python"
    return str(venv) if venv.exists() else sys.executable


@pytest.mark.slow  # ~25 s on these 2-core machines, even with the three imports run side by side
@pytest.mark.timeout(300)
def test_vendored_trees_import_in_fresh_interpreters():
    absent = sorted({pkg for pkg in MODULES.values() if not (REPO_ROOT / pkg).is_dir()})
    if absent:
        pytest.skip(f"the repo root is not populated ({', '.join(absent)} absent): run setup_sources.sh first")
    code = "import importlib, sys; m = importlib.import_module(sys.argv[1]); print(m.__file__)"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # started together: the three imports take ~20 s one after the other on these machines
    procs = {
        mod: subprocess.Popen(
            [_python(), "-c", code, mod],
            cwd=REPO_ROOT,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for mod in MODULES
    }
    failures = []
    for mod, proc in procs.items():
        out, err = proc.communicate(timeout=280)
        if proc.returncode:
            failures.append(f"import {mod} failed:\n{err[-3000:]}")
            continue
        # the vendored folder at the root, not some installed copy
        assert out.strip().splitlines()[-1].startswith(str(REPO_ROOT / MODULES[mod]) + os.sep), (mod, out)
    assert not failures, "\n".join(failures)
