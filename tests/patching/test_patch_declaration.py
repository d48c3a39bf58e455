"""A Patch declaration refuses to exist when it is malformed, and says why, naming the patch."""

from __future__ import annotations

import os

import pytest

from verl_patches.patching.declaration import (
    ABSENT,
    ALL_DEVICES,
    CPU_ONLY,
    Kind,
    Patch,
    PatchDriftError,
    module_alias,
    replace,
    wrap,
)


def _ok(**overrides) -> Patch:
    fields = dict(
        name="p",
        target="pkg.mod:f",
        kind=Kind.REPLACE,
        fingerprint="",
        vendor_item="local",
        reason="test",
        replacement=lambda: None,
    )
    fields.update(overrides)
    return Patch(**fields)


def test_a_well_formed_declaration_exposes_module_and_qualname():
    p = _ok(target="pkg.mod:Cls.method")
    assert (p.module, p.qualname) == ("pkg.mod", "Cls.method")
    assert p.devices == ALL_DEVICES
    assert p.fingerprint_targets == ("pkg.mod:Cls.method",)
    assert _ok(fingerprint_of=("a:x", "b:y")).fingerprint_targets == ("a:x", "b:y")


@pytest.mark.parametrize("devices", [("gpu",), ("cpu", "tpu"), ("NPU",)])
def test_unknown_device_is_rejected(devices):
    with pytest.raises(ValueError, match=r"patch p: unknown device"):
        _ok(devices=devices)


def test_module_alias_needs_provides_and_a_bare_module_target():
    with pytest.raises(ValueError, match=r"patch a: a module alias needs .*provides"):
        Patch(name="a", target="x.y", kind=Kind.MODULE_ALIAS, fingerprint="", vendor_item="G1", reason="r")
    with pytest.raises(ValueError, match=r"bare module target"):
        Patch(
            name="a",
            target="x.y:z",
            kind=Kind.MODULE_ALIAS,
            fingerprint="",
            vendor_item="G1",
            reason="r",
            provides="ours.y",
        )
    alias = Patch(
        name="a", target="x.y", kind=Kind.MODULE_ALIAS, fingerprint="", vendor_item="G1", reason="r", provides="ours.y"
    )
    assert alias.module == "x.y" and alias.qualname == ""


@pytest.mark.parametrize("kind", [Kind.REPLACE, Kind.WRAP, Kind.REGISTRY])
def test_replace_wrap_and_registry_need_a_replacement(kind):
    with pytest.raises(ValueError, match=r"patch p: needs a replacement"):
        _ok(kind=kind, replacement=None, registry_key=("k",))


@pytest.mark.parametrize("kind", [Kind.REPLACE, Kind.WRAP, Kind.REGISTRY])
def test_attribute_kinds_need_a_module_colon_qualname_target(kind):
    with pytest.raises(ValueError, match=r"patch p: target must be 'module:qualname'"):
        _ok(kind=kind, target="pkg.mod.f", registry_key=("k",))


def test_registry_patch_needs_a_key():
    with pytest.raises(ValueError, match=r"patch p: a registry patch needs registry_key"):
        _ok(kind=Kind.REGISTRY)
    assert _ok(kind=Kind.REGISTRY, registry_key=("k",)).registry_key == ("k",)


def test_conditions_device_and_env_flag(monkeypatch):
    p = _ok(devices=("cpu",))
    assert p.condition_holds("cpu") == (True, "")
    ok, why = p.condition_holds("npu")
    assert not ok and why == "device is npu; applies on cpu"

    flagged = _ok(env_flag="VERL_PATCHES_ROLLOUT_STANDIN")
    monkeypatch.delenv("VERL_PATCHES_ROLLOUT_STANDIN", raising=False)
    assert flagged.condition_holds("cpu") == (False, "VERL_PATCHES_ROLLOUT_STANDIN is off")
    for off in ("0", "false", "No", "off", ""):
        monkeypatch.setenv("VERL_PATCHES_ROLLOUT_STANDIN", off)
        assert not flagged.condition_holds("cpu")[0], off
    for on in ("1", "true", "yes", "ON"):
        monkeypatch.setenv("VERL_PATCHES_ROLLOUT_STANDIN", on)
        assert flagged.condition_holds("cpu") == (True, ""), on
    # once "on" here and an error elsewhere: one grammar now
    monkeypatch.setenv("VERL_PATCHES_ROLLOUT_STANDIN", "enabled")
    with pytest.raises(ValueError, match=r"^VERL_PATCHES_ROLLOUT_STANDIN='enabled': expected 1, true, yes, on \(on\)"):
        flagged.condition_holds("cpu")

    default_on = _ok(env_flag="VERL_PATCHES_ROLLOUT_STANDIN", env_default=True)
    monkeypatch.delenv("VERL_PATCHES_ROLLOUT_STANDIN")
    assert default_on.condition_holds("cpu") == (True, "")
    assert default_on.condition_text() == "env VERL_PATCHES_ROLLOUT_STANDIN=1 by default"
    assert _ok().condition_text() == ""


def test_drift_error_names_patch_target_fingerprints_pin_and_override():
    p = _ok(name="x.y", target="verl.utils.device:get_torch_device", fingerprint="sha256:aaaa", vendor_item="G9")
    err = PatchDriftError(p, "sha256:bbbb", "verl refs/tags/v0.4.0 @ 0758489422e8 (sources.lock)")
    msg = str(err)
    for part in (
        "'x.y'",
        "G9",
        "verl.utils.device:get_torch_device",
        "sha256:aaaa",
        "sha256:bbbb",
        "verl refs/tags/v0.4.0 @ 0758489422e8",
        "VERL_PATCHES_ALLOW_DRIFT=x.y",
    ):
        assert part in msg
    assert (err.patch, err.found) == (p, "sha256:bbbb")
    assert ABSENT == "absent"


def test_the_kind_constructors_fix_the_kind_and_find_the_replacement_by_its_path():
    common = dict(name="p", target="os.path:join", fingerprint="", vendor_item="local", reason="test")
    replaced = replace(by="os.path:join", **common)
    assert replaced.kind is Kind.REPLACE and replaced.replacement() is os.path.join
    built = replace(built_by="os:getcwd", **common)
    assert built.kind is Kind.REPLACE and built.replacement() == os.getcwd()
    wrapped = wrap(by="os.path:basename", rebind=False, **common)
    assert wrapped.kind is Kind.WRAP and wrapped.replacement("/a/b") == "b" and not wrapped.rebind
    alias = module_alias(name="a", target="x.y", provides="ours.y", vendor_item="G1", reason="r", devices=CPU_ONLY)
    assert (alias.kind, alias.fingerprint, alias.provides, alias.devices) == (Kind.MODULE_ALIAS, "", "ours.y", ("cpu",))
    with pytest.raises(ValueError, match=r"patch p: replace\(\) takes exactly one of by= and built_by="):
        replace(**common)
    with pytest.raises(ValueError, match=r"exactly one of by= and built_by="):
        replace(by="os:sep", built_by="os:getcwd", **common)
