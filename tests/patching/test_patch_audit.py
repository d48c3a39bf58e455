"""`python -m verl_patches.audit` reports every declared patch with its status at the locked pin."""

from __future__ import annotations

import json

import pytest

from patching_testlib import PIN, REPO, run_python
from suite_components import require_components
from verl_patches.patches.catalog import all_patches
from verl_patches.patching.registry import UPSTREAM_ROOTS
from verl_patches.sources.lock import load_lock

LOCK = load_lock(REPO / "sources.lock")
LOCKED_PACKAGES = {c.package for c in LOCK.components.values()}


@pytest.fixture(scope="module")
def audit():
    r = run_python("import sys; from verl_patches.audit import main; sys.exit(main(['--json']))")
    return r.returncode, json.loads(r.stdout), r.stderr


def test_audit_lists_every_declared_patch_in_catalog_order(audit):
    rc, report, stderr = audit
    declared = all_patches()
    assert [p["name"] for p in report["patches"]] == [p.name for p in declared]
    for entry, p in zip(report["patches"], declared):
        assert entry["target"] == p.target
        assert entry["vendor_item"] == p.vendor_item
        assert entry["kind"] == p.kind.value
        assert entry["devices"] == list(p.devices)
        assert entry["declared_fingerprint"] == p.fingerprint
        assert entry["reason"] == p.reason
    assert report["summary"]["patches_total"] == len(declared)


def test_every_patch_on_a_locked_package_matches_its_pin(audit):
    rc, report, _ = audit
    pinned = [p for p in report["patches"] if p["target"].partition(":")[0].partition(".")[0] in LOCKED_PACKAGES]
    assert pinned, "the catalog must hold patches on the locked upstream trees"
    for p in pinned:
        assert p["status"] == "ok", p
        assert p["pin_fingerprint"] == p["declared_fingerprint"]
        top = p["target"].partition(":")[0].partition(".")[0]
        comp = next(c for c in LOCK.components.values() if c.package == top)
        assert f"{comp.ref} @ {comp.commit[:12]}" in p["detail"] or "absent at" in p["detail"], p
    assert report["summary"]["patches_drift"] == 0
    assert LOCKED_PACKAGES <= UPSTREAM_ROOTS


def test_patches_outside_the_lock_are_checked_against_the_installed_package_or_unpinned(audit):
    rc, report, _ = audit
    others = [p for p in report["patches"] if p["target"].partition(":")[0].partition(".")[0] not in LOCKED_PACKAGES]
    assert others
    for p in others:
        if p["declared_fingerprint"]:  # torch, transformers: pinned by the requirements files, installed here
            assert p["status"] == "ok", p
            assert p["pin_fingerprint"] == p["declared_fingerprint"] and "installed" in p["detail"]
        else:  # stand-ins (flash_attn, apex): nothing upstream to fingerprint
            assert p["status"] == "unpinned", p
    assert report["summary"]["patches_unpinned"] == sum(not p["declared_fingerprint"] for p in others)


def test_audit_exits_zero_when_everything_this_host_needs_matches(audit):
    """Exit 0 when every component matches; a component only the A3 job needs (MindSpeed on a CPU machine
    without git access) may be absent: still 0, with one line naming it (under CI nothing may be absent)."""
    rc, report, stderr = audit
    assert rc == 0, stderr
    absent = [c for c in report["components"] if c["status"] != "match"]
    assert all(c["status"] == "missing" and c["optional_here"] for c in absent), absent
    if absent:
        names = ", ".join(c["name"] for c in absent)
        assert f"audit: {names} not installed: optional on this cpu host" in stderr
        require_components(*(c["name"] for c in absent))  # skipped with that reason here, failed under CI
    else:
        assert "optional on this" not in stderr


def test_audit_optional_line_and_status_for_a_host_without_mindspeed():
    """The rule on a report where MindSpeed is absent and optional, and where it is absent but needed."""
    from verl_patches.audit import audit_exit_status, optional_missing_line

    comp = {"name": "mindspeed", "status": "missing", "optional_here": True}
    ok = {"name": "verl", "status": "match", "optional_here": False}
    report = {"device": "cpu", "components": [ok, comp], "summary": {"patches_drift": 0}}
    assert audit_exit_status(report) == 0
    assert optional_missing_line(report).startswith("audit: mindspeed not installed: optional on this cpu host")
    assert "bash setup_sources.sh --cache DIR" in optional_missing_line(report)
    assert audit_exit_status({**report, "summary": {"patches_drift": 1}}) == 1
    needed = {**report, "device": "npu", "components": [ok, {**comp, "optional_here": False}]}
    assert audit_exit_status(needed) == 1 and optional_missing_line(needed) == ""
    assert optional_missing_line({**report, "components": [ok]}) == ""


def test_audit_text_shows_the_patch_section():
    r = run_python("import sys; from verl_patches.audit import main; sys.exit(main([]))")
    assert "== At runtime (declared patches)" in r.stdout
    for p in all_patches():
        assert p.name in r.stdout and p.target in r.stdout
    assert f"{len(all_patches())} patches:" in r.stdout
    stacks = r.stdout.split("== Patch stacks", 1)[1]  # each printed outermost first (test_patch_stacks pins them)
    generate = "verl.workers.megatron_workers:ActorRolloutRefWorker.generate_sequences"
    assert stacks.index("1. megatron_worker.generate_sequences_progress") < stacks.index(
        "3. timing.megatron_workers.generate_sequences"
    )
    assert generate in stacks and "8 upstream target(s) carry more than one patch" in r.stdout


def test_audit_json_has_each_stack_and_the_relied_on_pins(audit):
    from verl_patches.patching.stacks import patch_stacks, stack_entries

    rc, report, _ = audit
    assert report["patch_stacks"] == stack_entries(patch_stacks(all_patches()))
    assert report["summary"]["patch_stacks"] == 8 and report["summary"]["patch_layers_hidden"] == 0
    fit = next(p for p in report["patches"] if p["name"] == "trainer.fit_step_plan")
    assert len(fit["relies_on"]) > 20 and all(r["status"] == "ok" for r in fit["relies_on"]), fit["relies_on"]


DRIFTED_CATALOG = r"""
import dataclasses, sys
import verl_patches.patches.catalog as catalog
from verl_patches.patching.declaration import ABSENT, Kind, Patch
real = catalog.all_patches

def drifted():
    out = []
    for p in real():
        if p.name == "cpu.verl.utils.device.get_torch_device":
            p = dataclasses.replace(p, fingerprint="sha256:00000000deadbeef")
        out.append(p)
    out.append(Patch(name="test.adds_existing", target="verl.utils.device:get_device_name", kind=Kind.REPLACE,
                     fingerprint=ABSENT, vendor_item="local", reason="test", replacement=lambda: None))
    return out

catalog.all_patches = drifted
from verl_patches.audit import main
sys.exit(main(sys.argv[1:]))
"""


def test_drifted_declaration_shows_drift_and_exit_1():
    r = run_python(DRIFTED_CATALOG.replace("sys.argv[1:]", "['--json']"))
    assert r.returncode == 1, r.stderr
    report = json.loads(r.stdout)
    by = {p["name"]: p for p in report["patches"]}
    drift = by["cpu.verl.utils.device.get_torch_device"]
    assert drift["status"] == "drift"
    assert drift["pin_fingerprint"] == "sha256:66ca2b0ba76001d2"
    assert "declared sha256:00000000deadbeef" in drift["detail"] and PIN in drift["detail"]
    added = by["test.adds_existing"]
    assert added["status"] == "drift" and "defines it" in added["detail"]
    assert report["summary"]["patches_drift"] == 2
    text = run_python(DRIFTED_CATALOG.replace("sys.argv[1:]", "[]"))
    assert text.returncode == 1
    assert "DRIFT" in text.stdout and "2 drifted" in text.stdout


def test_audit_needs_only_the_standard_library() -> None:
    """`setup_sources.sh --audit` runs before any dependency is installed: no torch, no site-packages."""
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-S", "-m", "verl_patches.audit", "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "VERL_PATCHES_FINGERPRINT_CACHE": "off"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    statuses = {p["name"]: p["status"] for p in report["patches"]}
    assert statuses["cpu.verl.utils.device.get_torch_device"] == "ok"  # verl is read from the vendored tree
    assert statuses["cpu.torch.fsdp.no_pinned_param_offload"] == "unpinned"  # torch is not importable here
