"""--verify and the audit: the populated root is exactly the lock plus one line; edits show up with their diff."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from sources_testlib import (
    PRELUDE_LINE,
    REAL_USER_CACHE,
    REPO_ROOT,
    V1_FILES,
    WHEEL_FILE,
    alpha_component,
    copy_real_root,
    make_wheel,
    run_setup,
    write_alpha_manifests,
    write_lock,
)
from verl_patches import audit
from verl_patches.sources.lock import load_lock

PACKAGES = ["verl", "vllm", "vllm_ascend", "megatron", "mindspeed", "mindspeed_llm"]

TOP_KEYS = {
    "schema",
    "lock",
    "device",
    "components",
    "patches",
    "patch_stacks",
    "summary",
    "distributions",
    "weight_sync",
    "npu_emulation",
    "package_versions",
    "hang_diagnosis",
}
COMPONENT_KEYS = {
    "name",
    "package",
    "ref",
    "commit",
    "pypi_file",
    "needed_on",
    "optional_here",
    "route",
    "origin_route",
    "status",
    "expected_tree_sha256",
    "found_tree_sha256",
    "differences",
    "problems",
    "prelude",
    "diff",
    "diff_unavailable",
}
PATCH_KEYS = {
    "name",
    "target",
    "kind",
    "vendor_item",
    "reason",
    "devices",
    "condition",
    "declared_fingerprint",
    "pin_fingerprint",
    "status",
    "detail",
    "relies_on",
}
SUMMARY_KEYS = {
    "components_matching",
    "components_total",
    "diff_lines",
    "patches_total",
    "patches_ok",
    "patches_drift",
    "patches_unpinned",
    "patch_stacks",
    "patch_layers_hidden",
}


def run_audit(*args, env=None) -> tuple[int, str, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "verl_patches.audit", *map(str, args)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )
    return proc.returncode, proc.stdout, proc.stderr


def diff_lines(diff: str) -> tuple[list[str], list[str]]:
    body = [ln for ln in diff.splitlines() if not ln.startswith(("+++", "---"))]
    return [ln[1:] for ln in body if ln.startswith("+")], [ln[1:] for ln in body if ln.startswith("-")]


@pytest.fixture
def real_root_populated():
    present = [p for p in PACKAGES if (REPO_ROOT / p).is_dir()]
    if "verl" not in present:
        pytest.skip("the repo root is not populated: run setup_sources.sh first")
    return present


# --------------------------------------------------------------------------- the real root, read-only


def test_real_root_verifies(real_root_populated):
    r = run_setup("--verify")
    lock = load_lock(REPO_ROOT / "sources.lock")
    absent = [n for n, c in lock.components.items() if c.package not in real_root_populated]
    # every folder present matches; an absent one may only be a component this CPU host does not need
    assert r.rc == (3 if absent else 0), r.text
    for name in lock.components:
        line = next(ln for ln in r.out.splitlines() if ln.startswith(name + " "))
        assert (" OK " in line) if name not in absent else ("MISSING (optional on this host)" in line), line


def test_real_root_audit_is_exactly_the_one_inserted_line(real_root_populated):
    state = REPO_ROOT / ".sources_state.json"
    state_mtime = state.stat().st_mtime_ns if state.exists() else None
    rc, out, err = run_audit("--json")
    report = json.loads(out)
    assert rc in (0, 3), (err, report["summary"])
    assert report["schema"] == "verl-overlay-audit/1"
    added, removed = [], []
    for c in report["components"]:
        if c["package"] in real_root_populated:
            assert c["status"] == "match", (c["name"], c["problems"])
            assert c["problems"] == [] and c["diff_unavailable"] == []
        else:
            assert c["status"] == "missing" and c["optional_here"]
        a, r = diff_lines(c["diff"])
        added += a
        removed += r
        if c["name"] != "verl":
            assert c["diff"] == ""
    assert added == [PRELUDE_LINE] and removed == []
    verl = next(c for c in report["components"] if c["name"] == "verl")
    assert "+++ b/verl/workers/megatron_workers.py" in verl["diff"]
    assert verl["prelude"] == {"file": "verl/workers/megatron_workers.py", "expected": True, "in_place": True}
    assert report["summary"]["diff_lines"] == 1
    assert report["summary"]["components_matching"] == len(real_root_populated)
    # the audit wrote nothing
    assert (state.stat().st_mtime_ns if state.exists() else None) == state_mtime
    assert not (REPO_ROOT / ".sources_build").exists()


def test_setup_sources_audit_is_the_same_report(real_root_populated):
    r = run_setup("--audit", "--json", "--only", "verl")
    rc, out, _ = run_audit("--json", "--only", "verl")
    assert r.rc == rc
    assert json.loads(r.out)["components"] == json.loads(out)["components"]


# --------------------------------------------------------------------------- schema


def _documented(key: str) -> bool:
    return f'"{key}"' in audit.__doc__


def _documented_patch_statuses() -> set[str]:
    m = re.search(r'"status": "(ok\|[a-z|-]+)"', audit.__doc__)
    assert m, "verl_patches/audit.py's docstring no longer documents the patch statuses"
    return set(m.group(1).split("|"))


def test_json_schema_keys_are_the_documented_ones(tmp_path, upstream):
    lock = write_lock(tmp_path / "root" / "sources.lock", {"alpha": alpha_component(upstream)})
    assert run_setup("--route", "git", lock=lock, root=lock.parent).rc == 0
    rc, out, err = run_audit("--json", "--lock", lock)
    assert rc == 0, err
    report = json.loads(out)
    assert set(report) == TOP_KEYS
    assert report["schema"] == "verl-overlay-audit/1"
    assert set(report["summary"]) == SUMMARY_KEYS
    assert report["components"] and report["patches"]
    for c in report["components"]:
        assert set(c) == COMPONENT_KEYS
        assert c["status"] in ("match", "mismatch", "missing")
        assert set(c["prelude"]) == {"file", "expected", "in_place"}
        assert set(c["differences"]) <= {"changed", "added", "removed"}
    for p in report["patches"]:
        assert set(p) == PATCH_KEYS
        assert p["status"] in _documented_patch_statuses()
    for key in TOP_KEYS | COMPONENT_KEYS | PATCH_KEYS | SUMMARY_KEYS | {"file", "expected", "in_place"}:
        assert _documented(key), f"audit JSON key {key!r} is not in verl_patches/audit.py's documented schema"


# --------------------------------------------------------------------------- edits show up


@pytest.mark.parametrize("route", ["git", "pypi"])
def test_an_edit_shows_in_verify_and_in_the_audit_diff(tmp_path, upstream, index, route):
    index.publish("alpha", WHEEL_FILE, make_wheel(V1_FILES))
    lock = write_alpha_manifests(
        write_lock(tmp_path / "root" / "sources.lock", {"alpha": alpha_component(upstream, index)})
    )
    root = lock.parent
    assert run_setup("--route", route, "--index-url", index.simple_url, lock=lock, root=root).rc == 0
    (root / "alpha/data/table.txt").write_bytes(b"a,b\n1,2\n3,4\n")
    (root / "alpha/extra.py").write_bytes(b"added = True\n")

    r = run_setup("--verify", lock=lock, root=root)
    assert r.rc == 1 and "MISMATCH" in r.out
    assert "alpha/data/table.txt" in r.out and "alpha/extra.py" in r.out

    rc, out, err = run_audit("--json", "--lock", lock)
    assert rc == 1, err
    (c,) = json.loads(out)["components"]
    assert c["status"] == "mismatch" and c["diff_unavailable"] == []
    assert c["differences"]["changed"] == ["data/table.txt"] and c["differences"]["added"] == ["extra.py"]
    added, removed = diff_lines(c["diff"])
    assert sorted(added) == sorted([PRELUDE_LINE, "3,4", "added = True"]) and removed == []
    assert "+++ b/alpha/data/table.txt" in c["diff"] and "+++ b/alpha/extra.py" in c["diff"]
    rc, text, _ = run_audit("--lock", lock)
    assert "+3,4" in text and "MISMATCH" in text


def test_an_edit_in_a_copy_of_the_real_verl(tmp_path):
    root = copy_real_root(tmp_path / "root", ["verl"])
    target = root / "verl/trainer/ppo/core_algos.py"
    target.write_bytes(target.read_bytes() + b"# local edit\n")
    r = run_setup("--verify", "--only", "verl", lock=root / "sources.lock", root=root)
    assert r.rc == 1 and "changed: verl/trainer/ppo/core_algos.py" in r.out

    wheel = REAL_USER_CACHE / "pypi" / load_lock(root / "sources.lock").components["verl"].pypi.file
    if not wheel.exists():
        pytest.skip(f"the audit diff needs the pristine verl wheel, absent from {wheel.parent}")
    # the state of the real root may not record where the wheel is: the audit finds it in the download cache
    rc, out, err = run_audit(
        "--json", "--lock", root / "sources.lock", "--only", "verl", env={"VERL_OVERLAY_CACHE": str(REAL_USER_CACHE)}
    )
    assert rc == 1, err
    (c,) = json.loads(out)["components"]
    assert c["diff_unavailable"] == []
    added, removed = diff_lines(c["diff"])
    assert sorted(added) == sorted([PRELUDE_LINE, "# local edit"]) and removed == []
