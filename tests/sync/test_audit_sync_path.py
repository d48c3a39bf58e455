"""The audit shows which weight-sync path is active."""

from __future__ import annotations

import json
import os

import pytest

from fresh_python import fresh_python


@pytest.mark.parametrize("flag, path", [(None, "all-to-all"), ("1", "all-gather")])
def test_audit_reports_the_active_sync_path(flag, path):
    env = {k: v for k, v in os.environ.items() if k != "NO_ALL_TO_ALL_RESHARD"}
    if flag is not None:
        env["NO_ALL_TO_ALL_RESHARD"] = flag
    r = fresh_python("-m", "verl_patches.audit", "--json", env=env)
    assert r.stdout, r.stderr
    report = json.loads(r.stdout)
    assert report["weight_sync"]["path"] == path
    text = fresh_python("-m", "verl_patches.audit", env=env).stdout
    assert f"== Weight sync (Megatron -> rollout)\n{path} (" in text
