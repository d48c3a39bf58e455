"""Our fit loop re-implements upstream's `RayPPOTrainer.fit`: every upstream helper it calls is pinned.

`trainer.fit_step_plan` pins `fit` itself and, in `relies_on`, each upstream function, method and class
`verl_patches/driver/fit_loop.py` calls by name. A change to any of them fails like any other drift:
the registry raises `PatchDriftError` naming that helper, and the audit reports the patch as drifted.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys

import pytest

from patching_testlib import PIN, REPO, run_json
from verl_patches.patches.verl.trainer.declarations import FIT_LOOP_RELIES_ON
from verl_patches.patching.declaration import Kind, Patch, PatchDriftError
from verl_patches.patching.fingerprint import fingerprint_target

FIT_LOOP = REPO / "verl_patches" / "driver" / "fit_loop.py"
FIT_PATCH = "trainer.fit_step_plan"
HELPER = "verl.trainer.ppo.ray_trainer:compute_advantage"
WRONG = "sha256:00000000deadbeef"


def upstream_names_called(path=FIT_LOOP) -> set[str]:
    """Qualified names of the verl objects fit_loop.py reaches by name: `rt.X` (ray_trainer's module
    names), `trainer._X()`, `trainer.<manager>.X()`, `batch.X()` (a DataProto) and names imported from verl."""
    tree = ast.parse(path.read_text())
    managers = {"resource_pool_manager": "ResourcePoolManager", "async_rollout_manager": "AsyncLLMServerManager"}
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "verl":
            found |= {a.asname or a.name for a in node.names if a.name[0].isupper()}  # classes: DataProto, Tracking
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        if isinstance(base, ast.Name) and base.id == "rt":
            found.add(node.attr)
        elif isinstance(base, ast.Name) and base.id == "trainer" and node.attr.startswith("_"):
            found.add(f"RayPPOTrainer.{node.attr}")
        elif isinstance(base, ast.Name) and base.id in ("batch", "DataProto"):
            if node.attr in ("pop", "repeat", "union", "from_single_dict"):
                found.add(f"DataProto.{node.attr}")
        elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "trainer":
            if base.attr in managers:
                found.add(f"{managers[base.attr]}.{node.attr}")
    return found


def test_every_upstream_name_the_loop_calls_is_pinned():
    pinned = {target.partition(":")[2] for target, _ in FIT_LOOP_RELIES_ON}  # qualnames: "compute_advantage", ...
    called = upstream_names_called()
    assert {"compute_advantage", "RayPPOTrainer._validate", "DataProto.union", "Tracking"} <= called  # the scan works
    missing = called - pinned - {"DataProto"}  # the loop uses DataProto only through the methods pinned
    assert missing == set(), f"fit_loop.py calls upstream names no relies_on entry pins: {sorted(missing)}"


def test_every_fit_loop_pin_matches_the_vendored_source():
    wrong = {t: (fp, found) for t, fp in FIT_LOOP_RELIES_ON if (found := fingerprint_target(t, root=REPO)) != fp}
    assert wrong == {}
    from verl_patches.patches.catalog import all_patches

    fit = next(p for p in all_patches() if p.name == FIT_PATCH)
    assert fit.relies_on == FIT_LOOP_RELIES_ON and fit.target.endswith("RayPPOTrainer.fit")


# ---- the registry: each relied-on object checked on its own -------------------------------------
def _wrap(mod: str, relies_on) -> Patch:
    return Patch(
        name="uses_helper",
        target=f"{mod}:f",
        kind=Kind.WRAP,
        fingerprint=fingerprint_target(f"{mod}:f"),
        vendor_item="local",
        reason="test",
        replacement=lambda o: lambda: "patched",
        relies_on=relies_on,
    )


def test_a_relied_on_helper_that_drifted_is_named(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    mod = scratch.write("up", "def f():\n    return helper()\n\ndef helper():\n    return 1\n")
    importlib.import_module(mod)
    good = fingerprint_target(f"{mod}:helper")
    reg = make_registry([_wrap(mod, ((f"{mod}:helper", good),))])
    assert reg.records[0].status == "applied" and sys.modules[mod].f() == "patched"
    reg.revert()

    with pytest.raises(PatchDriftError) as info:
        make_registry([_wrap(mod, ((f"{mod}:helper", WRONG),))])
    msg = str(info.value)
    for part in ("'uses_helper'", f"relies on {mod}:helper", good, WRONG, f"the fingerprint of {mod}:helper"):
        assert part in msg, part
    assert info.value.relied_on == f"{mod}:helper" and info.value.found == good
    assert sys.modules[mod].f() == 1  # not applied

    with pytest.raises(PatchDriftError, match=r"relies on .*:gone, whose upstream source fingerprint is missing"):
        make_registry([_wrap(mod, ((f"{mod}:gone", WRONG),))])


def test_allowed_drift_of_a_helper_applies_and_says_which(scratch, make_registry, monkeypatch):
    monkeypatch.setenv("VERL_PATCHES_ALLOW_DRIFT", "uses_helper")
    mod = scratch.write("up", "def f():\n    return 0\n\ndef helper():\n    return 1\n")
    importlib.import_module(mod)
    rec = make_registry([_wrap(mod, ((f"{mod}:helper", WRONG),))]).records[0]
    assert rec.status == "applied-with-drift"
    assert rec.detail == f"applied despite drift: found {fingerprint_target(f'{mod}:helper')} for {mod}:helper"


# ---- the real fit patch: a helper's drift stops the driver, and the audit reports it -------------
def _catalog_with_wrong_helper_pin():
    from verl_patches.patches.catalog import all_patches

    out = []
    for p in all_patches():
        if p.name == FIT_PATCH:
            p = dataclasses.replace(p, relies_on=tuple((t, WRONG if t == HELPER else fp) for t, fp in p.relies_on))
        out.append(p)
    return out


def test_the_audit_reports_a_drifted_fit_helper_by_name():
    from verl_patches.patching.static_report import static_patch_report

    report = {p["name"]: p for p in static_patch_report(REPO, _catalog_with_wrong_helper_pin(), "cpu")}
    fit = report[FIT_PATCH]
    assert fit["status"] == "drift"
    assert f"relies on {HELPER}: declared {WRONG}, {PIN}" in fit["detail"]
    [drifted] = [r for r in fit["relies_on"] if r["status"] != "ok"]
    assert drifted["target"] == HELPER and drifted["pin_fingerprint"] == fingerprint_target(HELPER, root=REPO)
    assert sum(r["status"] == "ok" for r in fit["relies_on"]) == len(FIT_LOOP_RELIES_ON) - 1


DRIFTED_HELPER_SCRIPT = r"""
import dataclasses, json
import verl_patches.patches.catalog as catalog
real = catalog.all_patches
def drifted():
    out = []
    for p in real():
        if p.name == "trainer.fit_step_plan":
            p = dataclasses.replace(p, relies_on=tuple((t, "sha256:00000000deadbeef" if t.endswith(":compute_advantage")
                                                        else fp) for t, fp in p.relies_on))
        out.append(p)
    return out
catalog.all_patches = drifted
from verl_patches.patching.declaration import PatchDriftError
out = {}
try:
    import verl_patches.prelude_patch
    import verl.trainer.ppo.ray_trainer as rt
    out["error"] = None
except PatchDriftError as e:
    out["error"], out["relied_on"], out["found"] = str(e), e.relied_on, e.found
from verl_patches.patching.registry import get_registry
rec = next(r for r in get_registry().records if r.patch.name == "trainer.fit_step_plan")
out["status"] = rec.status
print(json.dumps(out))
"""


@pytest.mark.slow  # a fresh interpreter importing verl's trainer: about 20 s
def test_a_drifted_fit_helper_stops_the_driver_naming_it():
    out, _ = run_json(DRIFTED_HELPER_SCRIPT, env={"VERL_PATCHES_QUIET": "1"})
    assert out["error"] is not None, "a drifted helper must make the fit patch fail"
    for part in (f"'{FIT_PATCH}'", f"relies on {HELPER}", WRONG, PIN, f"VERL_PATCHES_ALLOW_DRIFT={FIT_PATCH}"):
        assert part in out["error"], part
    assert out["relied_on"] == HELPER and out["found"] == fingerprint_target(HELPER, root=REPO)
    assert out["status"] == "drift"
