"""Declared fingerprints must not depend on the Python minor version (A3 hosts run 3.10 or 3.11)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TARGETS = [
    "verl.utils.device:get_torch_device",
    "verl.workers.fsdp_workers:ActorRolloutRefWorker.__init__",
    "verl.workers.sharding_manager.megatron_vllm:MegatronVLLMShardingManager.__enter__",
]
SNIPPET = (
    "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
    "from verl_patches.patching.fingerprint import fingerprint_target as f; "
    "print(' '.join(f(t, root=Path(sys.argv[1])) for t in sys.argv[2:]))"
)


def interpreters() -> list[str]:
    """One interpreter per minor version, from PATH or pyenv's version folders."""
    candidates = [shutil.which(f"python3.{m}") for m in (10, 11, 12)]
    candidates += sorted(str(p) for p in Path.home().glob(".pyenv/versions/3.1[012]*/bin/python3"))
    found: dict[str, str] = {}
    for path in filter(None, candidates):
        out = subprocess.run([path, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True)
        if out.returncode == 0:
            found.setdefault(out.stdout.strip(), path)
    return list(found.values())


def test_fingerprints_are_identical_on_every_available_python_minor() -> None:
    pythons = interpreters()
    if len(pythons) < 2:
        pytest.skip(f"needs two Python minor versions on PATH to compare, found {pythons}")
    results = {}
    for py in pythons:
        out = subprocess.run(
            [py, "-c", SNIPPET, str(REPO), *TARGETS],
            capture_output=True,
            text=True,
            env={"VERL_PATCHES_FINGERPRINT_CACHE": "off", "PATH": "/usr/bin:/bin"},
        )
        assert out.returncode == 0, out.stderr
        results[py] = out.stdout.split()
    assert len({tuple(v) for v in results.values()}) == 1, results
