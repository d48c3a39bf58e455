"""The audit shows which weight-sync path is active."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag, path", [(None, "all-to-all"), ("1", "all-gather")])
def test_audit_reports_the_active_sync_path(flag, path):
    env = {k: v for k, v in os.environ.items() if k != "NO_ALL_TO_ALL_RESHARD"}
    if flag is not None:
        env["NO_ALL_TO_ALL_RESHARD"] = flag
    r = subprocess.run(
        [sys.executable, "-m", "verl_patches.audit", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.stdout, r.stderr
    report = json.loads(r.stdout)
    assert report["weight_sync"]["path"] == path
    text = subprocess.run(
        [sys.executable, "-m", "verl_patches.audit"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    ).stdout
    assert f"== Weight sync (Megatron -> rollout)\n{path} (" in text
