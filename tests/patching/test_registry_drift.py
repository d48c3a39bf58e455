"""Drift detection: a patch applies only to the upstream source it was written against.

Unit level on throwaway modules, then with the real vendored verl module (`verl.utils.device`) at its
pin, with a deliberately edited copy of the verl tree shadowing the real one, and with a MindSpeed
module that cannot import on a CPU host.
"""

from __future__ import annotations

import importlib
import logging
import shutil
import sys

import pytest

from patching_testlib import PIN, REPO, run_json, run_python
from verl_patches.patching.declaration import ABSENT, Kind, Patch, PatchDriftError
from verl_patches.patching.fingerprint import fingerprint_target

UPSTREAM = """
def f(x):
    return x + 1

def helper():
    return 0
"""

SAME_CODE_NEW_FORMAT = """
# a comment that upstream added
def f(x):

    return x + 1   # trailing comment

def helper():
    return 0
"""

EDITED = """
def f(x):
    return x + 2

def helper():
    return 0
"""


def replace(name, target, fingerprint, **kw) -> Patch:
    return Patch(
        name=name,
        target=target,
        kind=Kind.REPLACE,
        fingerprint=fingerprint,
        vendor_item="local",
        reason="test",
        replacement=kw.pop("replacement", lambda: lambda x: "patched"),
        **kw,
    )


# ---- unit level ---------------------------------------------------------------------------------
def test_fingerprint_ignores_formatting_and_comments_but_not_code(scratch):
    a = scratch.write("a", UPSTREAM)
    b = scratch.write("b", SAME_CODE_NEW_FORMAT)
    c = scratch.write("c", EDITED)
    fa = fingerprint_target(f"{a}:f")
    assert fa.startswith("sha256:") and len(fa) == len("sha256:") + 16
    assert fingerprint_target(f"{b}:f") == fa
    assert fingerprint_target(f"{c}:f") != fa
    assert fingerprint_target(f"{c}:helper") == fingerprint_target(f"{a}:helper")


def test_fingerprint_cache_is_keyed_by_content(scratch, tmp_path, monkeypatch):
    import os

    from verl_patches.patching import fingerprint as fpm

    cache = tmp_path / "fp-cache"
    monkeypatch.setenv(fpm.CACHE_ENV, str(cache))
    mod = scratch.write("cached", UPSTREAM)
    first = fingerprint_target(f"{mod}:f")
    entries = list(cache.iterdir())
    assert len(entries) == 1 and entries[0].read_text() == first
    entries[0].write_text("sha256:cachedvalue00000")  # prove the second call reads the cache
    assert fingerprint_target(f"{mod}:f") == "sha256:cachedvalue00000"

    # An edit is a new key, even when the file keeps its size and its mtime.
    path = scratch.root / scratch.package / "cached.py"
    stat = path.stat()
    edited = UPSTREAM.replace("x + 1", "x - 1")
    assert len(edited) == len(UPSTREAM)
    path.write_text(edited)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert fingerprint_target(f"{mod}:f") == fingerprint_target(f"{scratch.write('ref', edited)}:f") != first

    monkeypatch.setenv(fpm.CACHE_ENV, "off")
    path.write_text(UPSTREAM)
    assert fingerprint_target(f"{mod}:f") == first  # computed, not read from the (poisoned) cache


def test_matching_fingerprint_applies_and_records_it(scratch, make_registry):
    mod = scratch.write("up", UPSTREAM)
    fp = fingerprint_target(f"{mod}:f")
    importlib.import_module(mod)
    reg = make_registry([replace("p", f"{mod}:f", fp)])
    assert reg.records[0].status == "applied" and reg.records[0].found_fingerprint == fp
    assert sys.modules[mod].f(1) == "patched"


def test_drift_is_refused_with_a_named_error(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    original_fp = fingerprint_target(f"{scratch.write('orig', UPSTREAM)}:f")
    mod = scratch.write("up", EDITED)
    found = fingerprint_target(f"{mod}:f")
    m = importlib.import_module(mod)
    with pytest.raises(PatchDriftError) as info:
        make_registry([replace("drifty", f"{mod}:f", original_fp)])
    msg = str(info.value)
    for part in (
        "'drifty'",
        f"{mod}:f",
        original_fp,
        found,
        f"{scratch.package} (not pinned by sources.lock)",
        "VERL_PATCHES_ALLOW_DRIFT=drifty",
    ):
        assert part in msg, part
    assert m.f(1) == 3  # not applied


def test_drift_in_a_module_imported_later_fails_that_import(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    mod = scratch.write("up", EDITED)
    reg = make_registry([replace("drifty", f"{mod}:f", "sha256:0000000000000000")])
    assert reg.records[0].status == "pending"
    with pytest.raises(PatchDriftError, match="drifty"):
        importlib.import_module(mod)
    assert reg.records[0].status == "drift"


@pytest.mark.parametrize("allow", ["drifty", "other,drifty", "all"])
def test_allow_drift_downgrades_to_a_loud_warning(scratch, make_registry, monkeypatch, caplog, allow):
    monkeypatch.setenv("VERL_PATCHES_ALLOW_DRIFT", allow)
    mod = scratch.write("up", EDITED)
    importlib.import_module(mod)
    with caplog.at_level(logging.WARNING, logger="verl_patches"):
        reg = make_registry([replace("drifty", f"{mod}:f", "sha256:0000000000000000")])
    rec = reg.records[0]
    assert rec.status == "applied-with-drift"
    assert rec.found_fingerprint == fingerprint_target(f"{mod}:f")
    assert sys.modules[mod].f(1) == "patched"
    assert any(
        "DRIFT ALLOWED BY VERL_PATCHES_ALLOW_DRIFT" in r.getMessage() and "drifty" in r.getMessage()
        for r in caplog.records
    )


def test_allow_drift_for_another_patch_does_not_cover_this_one(scratch, make_registry, monkeypatch):
    monkeypatch.setenv("VERL_PATCHES_ALLOW_DRIFT", "some.other.patch")
    mod = scratch.write("up", EDITED)
    importlib.import_module(mod)
    with pytest.raises(PatchDriftError):
        make_registry([replace("drifty", f"{mod}:f", "sha256:0000000000000000")])


def test_fingerprint_of_covers_every_listed_source(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    a = scratch.write("a", UPSTREAM)
    b = scratch.write("b", UPSTREAM)
    fp = fingerprint_target(f"{a}:f", f"{b}:helper")
    assert fp != fingerprint_target(f"{a}:f")
    importlib.import_module(a)
    reg = make_registry([replace("multi", f"{a}:f", fp, fingerprint_of=(f"{a}:f", f"{b}:helper"))])
    assert reg.records[0].status == "applied"
    reg.revert()
    c = scratch.write("c", EDITED.replace("return 0", "return 1"))  # a different `helper`
    with pytest.raises(PatchDriftError, match="multi"):
        make_registry([replace("multi", f"{a}:f", fp, fingerprint_of=(f"{a}:f", f"{c}:helper"))])


def test_absent_patch_drifts_when_upstream_now_defines_the_name(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    mod = importlib.import_module(scratch.write("up", UPSTREAM))
    added = make_registry([replace("adds", f"{mod.__name__}:new_helper", ABSENT)])
    assert added.records[0].status == "applied" and mod.new_helper(0) == "patched"
    added.revert()
    assert not hasattr(mod, "new_helper")

    with pytest.raises(PatchDriftError, match="adds .*helper, but upstream now defines it"):
        make_registry([replace("adds", f"{mod.__name__}:helper", ABSENT)])
    assert mod.helper() == 0

    monkeypatch.setenv("VERL_PATCHES_ALLOW_DRIFT", "adds")
    allowed = make_registry([replace("adds", f"{mod.__name__}:helper", ABSENT)])
    assert allowed.records[0].status == "applied-with-drift"
    assert allowed.records[0].found_fingerprint == "present"


def test_missing_definition_is_drift_with_the_reason(scratch, make_registry, monkeypatch):
    monkeypatch.delenv("VERL_PATCHES_ALLOW_DRIFT", raising=False)
    mod = importlib.import_module(scratch.write("up", UPSTREAM))
    with pytest.raises(PatchDriftError, match=r"found missing|fingerprint is missing") as info:
        make_registry(
            [
                Patch(
                    name="gone",
                    target=f"{mod.__name__}:renamed",
                    kind=Kind.WRAP,
                    fingerprint="sha256:1111111111111111",
                    vendor_item="local",
                    reason="test",
                    replacement=lambda o: o,
                )
            ]
        )
    assert "no definition of 'renamed'" in str(info.value)


# ---- the real vendored verl module --------------------------------------------------------------
REAL_PIN_SCRIPT = r"""
import json, sys
from verl_patches.patching.declaration import ABSENT, Kind, Patch, PatchDriftError
from verl_patches.patching.registry import Registry
from verl_patches.patches.catalog import all_patches

out = {}
declared = next(p for p in all_patches() if p.name == "cpu.verl.utils.device.get_torch_device")
reg = Registry([declared], "cpu").activate()
out["pending_before_import"] = reg.records[0].status
import verl.utils.device as d
from verl_patches.patches.verl.utils.device import get_torch_device as ours
rec = reg.records[0]
out["status"], out["found"], out["declared"] = rec.status, rec.found_fingerprint, declared.fingerprint
out["replaced"] = d.get_torch_device is ours
out["file"] = d.__file__
reg.revert()
out["reverted"] = d.get_torch_device is not ours and d.get_torch_device.__module__ == "verl.utils.device"

def absent(name, qual):
    return Patch(name=name, target=f"verl.utils.device:{qual}", kind=Kind.REPLACE, fingerprint=ABSENT,
                 vendor_item="local", reason="test", replacement=lambda: (lambda: "ours"))

try:
    Registry([absent("adds.get_device_name", "get_device_name")], "cpu").activate()
    out["absent_present"] = "no error"
except PatchDriftError as e:
    out["absent_present"] = str(e)
r2 = Registry([absent("adds.new_name", "vpt_new_name")], "cpu").activate()
out["absent_missing"] = [r2.records[0].status, d.vpt_new_name()]
r2.revert()

# A MindSpeed module needs torch_npu: on this host its patch is unavailable, with the import error.
ms = Patch(name="ms.adamw", target="mindspeed.optimizer.adamw:AdamW", kind=Kind.REPLACE,
           fingerprint="sha256:ab3bf1a674761f6b", vendor_item="G2", reason="test", replacement=lambda: object)
r3 = Registry([ms], "cpu").activate()
out["ms_before"] = r3.records[0].status
r3.resolve_pending()
out["ms_after"] = [r3.records[0].status, r3.records[0].detail]
out["summary"] = r3.summary_line()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real_pin():
    return run_json(REAL_PIN_SCRIPT)[0]


@pytest.mark.slow
def test_real_verl_module_at_its_pin_applies(real_pin):
    assert real_pin["file"] == str(REPO / "verl" / "utils" / "device.py")
    assert real_pin["pending_before_import"] == "pending"
    assert real_pin["status"] == "applied"
    assert real_pin["found"] == real_pin["declared"] == "sha256:66ca2b0ba76001d2"
    assert real_pin["replaced"] and real_pin["reverted"]


def test_fingerprint_cli_prints_the_declared_pin_value():
    r = run_python(
        "from verl_patches.patching.fingerprint import main; "
        "raise SystemExit(main(['verl.utils.device:get_torch_device']))"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["sha256:66ca2b0ba76001d2", "verl.utils.device:get_torch_device"]
    bad = run_python(
        "from verl_patches.patching.fingerprint import main; raise SystemExit(main(['verl.utils.device:not_there']))"
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "no definition of 'not_there'" in bad.stderr


@pytest.mark.slow
def test_absent_patch_against_real_module(real_pin):
    assert "adds.get_device_name" in real_pin["absent_present"]
    assert "verl.utils.device:get_device_name, but upstream now defines it" in real_pin["absent_present"]
    assert real_pin["absent_missing"] == ["applied", "ours"]


@pytest.mark.slow
@pytest.mark.skipif(
    not (REPO / "mindspeed" / "optimizer" / "adamw.py").is_file(),
    reason="MindSpeed is git-only and not set up on this host",
)
def test_target_that_cannot_import_here_is_unavailable_with_the_error(real_pin):
    assert real_pin["ms_before"] == "pending"
    status, detail = real_pin["ms_after"]
    assert status == "unavailable"
    assert "cannot import mindspeed.optimizer.adamw on this host" in detail
    assert "torch_npu" in detail
    assert "1 unavailable" in real_pin["summary"]


# ---- a deliberately edited copy of the verl tree ------------------------------------------------
EDITED_COPY_SCRIPT = r"""
import json, os, sys
import importlib.util
out = {"order": os.environ["ORDER"], "file": importlib.util.find_spec("verl.utils.device").origin}
if out["order"] == "upstream-first":
    import verl.utils.device
from verl_patches.patching.declaration import PatchDriftError
try:
    import verl_patches.prelude_patch                       # the real activation path, real catalog
    import verl.utils.device
    out["error"] = None
except PatchDriftError as e:
    out["error"] = str(e)
    out["error_found"] = e.found
from verl_patches.patching.registry import get_registry
rec = next(r for r in get_registry().records if r.patch.name == "cpu.verl.utils.device.get_torch_device")
out["status"] = rec.status
import verl.utils.device as d2
from verl_patches.patches.verl.utils.device import get_torch_device as ours
out["replaced"] = d2.get_torch_device is ours
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def edited_verl(tmp_path_factory):
    """A full copy of the vendored verl/ with get_torch_device's body changed; it comes first on sys.path."""
    root = tmp_path_factory.mktemp("edited")
    shutil.copytree(REPO / "verl", root / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    dev = root / "verl" / "utils" / "device.py"
    src = dev.read_text()
    assert "        return torch.cuda\n" in src
    dev.write_text(src.replace("        return torch.cuda\n", "        return torch.cpu  # edited downstream\n"))
    found = fingerprint_target("verl.utils.device:get_torch_device", root=root)
    assert found != "sha256:66ca2b0ba76001d2"
    return root, found


@pytest.mark.slow
@pytest.mark.parametrize("order", ["prelude-first", "upstream-first"])
def test_edited_upstream_copy_raises_named_drift_error(edited_verl, order):
    root, found = edited_verl
    out, _ = run_json(EDITED_COPY_SCRIPT, env={"ORDER": order, "VERL_PATCHES_QUIET": "1"}, pythonpath=(root,), cwd=root)
    assert out["file"] == str(root / "verl" / "utils" / "device.py")  # the edited copy, not the vendored one
    msg = out["error"]
    assert msg is not None, "an edited upstream function must make its patch fail"
    for part in (
        "'cpu.verl.utils.device.get_torch_device'",
        "verl.utils.device:get_torch_device",
        "sha256:66ca2b0ba76001d2",
        found,
        PIN,
        "VERL_PATCHES_ALLOW_DRIFT=",
    ):
        assert part in msg, part
    assert out["error_found"] == found
    assert out["status"] == "drift"
    assert not out["replaced"]


@pytest.mark.slow
def test_edited_upstream_copy_with_override_applies_loudly(edited_verl):
    root, found = edited_verl
    out, stderr = run_json(
        EDITED_COPY_SCRIPT,
        pythonpath=(root,),
        cwd=root,
        env={"ORDER": "prelude-first", "VERL_PATCHES_ALLOW_DRIFT": "cpu.verl.utils.device.get_torch_device"},
    )
    assert out["error"] is None
    assert out["status"] == "applied-with-drift" and out["replaced"]
    assert "DRIFT ALLOWED BY VERL_PATCHES_ALLOW_DRIFT" in stderr and found in stderr
