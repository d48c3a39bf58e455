"""Registry behaviour on throwaway modules: order, kinds, rebinding, later imports, idempotence,
revert, conditions, manifest. Each test builds its own Registry from a small custom Patch list."""

from __future__ import annotations

import importlib
import os
import sys

import pytest

from verl_patches.patching.declaration import Kind, Patch, PatchError
from verl_patches.patching.registry import MARKER, Registry

TARGET = """
def f():
    return "orig-f"

def g(x):
    return ("orig-g", x)

class C:
    def m(self):
        return "orig-m"

    @staticmethod
    def s():
        return "orig-s"

    @classmethod
    def c(cls):
        return ("orig-c", cls.__name__)

TABLE = {"a": 1, "nested": {"b": 2}}
"""

USER = """
from {pkg}.mod import f, g as renamed_g, C
"""


def patch(name, target, kind=Kind.REPLACE, replacement=None, **kw) -> Patch:
    return Patch(
        name=name,
        target=target,
        kind=kind,
        fingerprint=kw.pop("fingerprint", ""),
        vendor_item="local",
        reason="test",
        replacement=replacement,
        **kw,
    )


def new_f():
    return "new-f"


def tag_wrap(tag, calls=None):
    def wrap(original):
        def wrapper(*args, **kwargs):
            if calls is not None:
                calls.append(tag)
            return (tag, original(*args, **kwargs))

        return wrapper

    return wrap


@pytest.fixture
def mods(scratch):
    mod = importlib.import_module(scratch.write("mod", TARGET))
    user = importlib.import_module(scratch.write("user", USER.format(pkg=scratch.package)))
    return scratch.package, mod, user


# ---- order ------------------------------------------------------------------------------------
def test_patches_apply_in_declared_order(mods, make_registry):
    pkg, mod, _ = mods
    log: list[str] = []

    def factory(name):
        def make():
            log.append(name)
            return lambda: name

        return make

    names = ["z-first", "a-second", "m-third"]
    targets = [f"{pkg}.mod:f", f"{pkg}.mod:g", f"{pkg}.mod:new_attr"]
    reg = make_registry([patch(n, t, replacement=factory(n)) for n, t in zip(names, targets)])
    assert log == names
    assert [r.patch.name for r in reg.records] == names
    assert [m["name"] for m in reg.manifest()] == names


def test_pending_patches_on_one_module_apply_in_declared_order(scratch, make_registry):
    log: list[str] = []
    late = f"{scratch.package}.late"
    scratch.write("late", "def f():\n    return 0\n")
    reg = make_registry(
        [
            patch("two", f"{late}:f", Kind.WRAP, replacement=lambda o: (log.append("two"), o)[1]),
            patch("one", f"{late}:f", Kind.WRAP, replacement=lambda o: (log.append("one"), lambda: "one")[1]),
        ]
    )
    assert log == []
    importlib.import_module(late)
    assert log == ["two", "one"]
    assert sys.modules[late].f() == "one"
    assert [r.status for r in reg.records] == ["applied", "applied"]


def test_catalog_order_is_the_declaration_modules_order():
    from verl_patches.patches import catalog

    expected = [p.name for mod in catalog.DECLARATION_MODULES for p in importlib.import_module(mod).PATCHES]
    assert [p.name for p in catalog.all_patches()] == expected
    reg = Registry(catalog.all_patches(), "cpu")  # not activated: only the record order matters here
    assert [r.patch.name for r in reg.records] == expected
    assert expected[0] == "flash_attn.bert_padding.pure_torch"  # G1 first: verl imports need it


def test_duplicate_names_are_refused(mods):
    pkg, _, _ = mods
    with pytest.raises(PatchError, match="duplicate patch names: \\['dup'\\]"):
        Registry(
            [patch("dup", f"{pkg}.mod:f", replacement=new_f), patch("dup", f"{pkg}.mod:g", replacement=new_f)], "cpu"
        )


# ---- kinds ------------------------------------------------------------------------------------
def test_replace_function_rebinds_from_import_copies(mods, make_registry):
    pkg, mod, user = mods
    original = mod.f
    assert user.f is original  # the stale `from mod import f` copy made before activation
    reg = make_registry([patch("r", f"{pkg}.mod:f", replacement=lambda: new_f)])
    assert mod.f is new_f and user.f is new_f
    assert getattr(new_f, MARKER) == "r"
    rec = reg.records[0]
    assert rec.status == "applied" and rec.original is original
    assert (user.__dict__, "f") in rec.rebound
    assert reg.manifest()[0]["rebound"] == len(rec.rebound) >= 1


def test_wrap_function_gets_the_original_and_rebinds_renamed_copy(mods, make_registry):
    pkg, mod, user = mods
    make_registry([patch("w", f"{pkg}.mod:g", Kind.WRAP, replacement=tag_wrap("w"))])
    assert mod.g(1) == ("w", ("orig-g", 1))
    assert user.renamed_g is mod.g  # rebinding follows the object, not the name


def test_wrap_and_replace_methods_static_and_class_methods(mods, make_registry):
    pkg, mod, user = mods
    make_registry(
        [
            patch("m", f"{pkg}.mod:C.m", Kind.WRAP, replacement=tag_wrap("m")),
            patch("s", f"{pkg}.mod:C.s", Kind.WRAP, replacement=tag_wrap("s")),
            patch("c", f"{pkg}.mod:C.c", Kind.WRAP, replacement=tag_wrap("c")),
        ]
    )
    assert mod.C().m() == ("m", "orig-m")
    assert mod.C.s() == ("s", "orig-s") and mod.C().s() == ("s", "orig-s")

    class Sub(mod.C):
        pass

    assert Sub.c() == ("c", ("orig-c", "Sub"))  # still bound to the class it is called on
    assert isinstance(mod.C.__dict__["s"], staticmethod) and isinstance(mod.C.__dict__["c"], classmethod)
    assert user.C is mod.C


def test_replace_method(mods, make_registry):
    pkg, mod, _ = mods
    make_registry([patch("rm", f"{pkg}.mod:C.m", replacement=lambda: lambda self: "new-m")])
    assert mod.C().m() == "new-m"


def test_registry_entries_set_nested_and_new_keys_then_revert(mods, make_registry):
    pkg, mod, _ = mods
    table = mod.TABLE
    reg = make_registry(
        [
            patch("k-existing", f"{pkg}.mod:TABLE", Kind.REGISTRY, replacement=lambda: 10, registry_key=("a",)),
            patch("k-nested", f"{pkg}.mod:TABLE", Kind.REGISTRY, replacement=lambda: 20, registry_key=("nested", "b")),
            patch("k-new", f"{pkg}.mod:TABLE", Kind.REGISTRY, replacement=lambda: 30, registry_key=("added",)),
        ]
    )
    assert mod.TABLE is table  # changed in place, never replaced
    assert table == {"a": 10, "nested": {"b": 20}, "added": 30}
    assert [r.status for r in reg.records] == ["applied"] * 3
    reg.revert()
    assert table == {"a": 1, "nested": {"b": 2}}
    assert "added" not in table


def test_wrap_of_a_missing_attribute_is_an_error(mods, make_registry):
    pkg, _, _ = mods
    with pytest.raises(PatchError, match="does not exist, nothing to wrap"):
        make_registry([patch("w", f"{pkg}.mod:nope", Kind.WRAP, replacement=tag_wrap("w"))])


# ---- modules imported later -------------------------------------------------------------------
def test_target_imported_later_is_patched_before_anyone_imports_from_it(scratch, make_registry):
    late = scratch.write("late", "def f():\n    return 'orig'\n")
    consumer = scratch.write("consumer", f"from {late} import f\nCAPTURED = f()\n")
    reg = make_registry([patch("later", f"{late}:f", replacement=lambda: new_f)])
    rec = reg.records[0]
    assert rec.status == "pending" and rec.detail == f"applies when {late} is imported"
    assert late not in sys.modules

    cons = importlib.import_module(consumer)  # imports `late` first, through the hook
    assert sys.modules[late].f is new_f
    assert cons.f is new_f and cons.CAPTURED == "new-f"  # the copy made at import time is already new
    assert rec.status == "applied" and rec.detail == ""  # the pending note is gone
    from_later = importlib.import_module(scratch.write("consumer2", f"from {late} import f\n"))
    assert from_later.f is new_f


def test_pending_wrap_rebinds_copies_in_modules_loaded_after_the_hook(scratch, make_registry):
    """A module watched for one patch still gets its stale copies of another patch's original rebound."""
    base = importlib.import_module(scratch.write("base", "def f():\n    return 'orig'\n"))
    original = base.f
    watched = scratch.write("watched", f"import {base.__name__} as _b\nSTALE = _b.f\ndef h():\n    return 1\n")
    # `watched` must pick up the *original* base.f while it executes (as an upstream module does when it
    # copies a name from a module that another import path left unpatched): hand it the original for
    # the duration of its import.
    reg = make_registry(
        [
            patch("pf", f"{base.__name__}:f", replacement=lambda: new_f),
            patch("ph", f"{watched}:h", Kind.WRAP, replacement=tag_wrap("h")),
        ]
    )
    assert base.f is new_f
    base.f = original  # an upstream import-time copy of the original, as if taken before activation
    try:
        w = importlib.import_module(watched)
    finally:
        base.f = new_f
    assert w.STALE is new_f  # rebound by the post-import pass over the watched module
    assert w.h() == ("h", 1)
    assert reg.records[1].status == "applied"


def test_module_that_activates_the_registry_from_its_first_lines_is_patched_when_it_finishes(scratch, make_registry):
    """verl's megatron_workers imports the prelude before defining its classes: patches on those classes
    must wait for the module to finish, then apply before anyone can `from module import Class`."""
    activator = importlib.import_module(scratch.write("activator", "ACTIVATE = None\n"))
    worker = f"{scratch.package}.workers.megatron_like"
    scratch.write(
        "workers.megatron_like",
        f"""
        from {scratch.package} import activator
        activator.ACTIVATE()                      # the inserted prelude line
        class Worker:
            def generate(self):
                return "orig"
        """,
    )
    consumer = scratch.write("consumer", f"from {worker} import Worker\nRESULT = Worker().generate()\n")
    reg = make_registry(
        [patch("gen", f"{worker}:Worker.generate", Kind.WRAP, replacement=tag_wrap("w"))], activate=False
    )
    activator.ACTIVATE = reg.activate
    cons = importlib.import_module(consumer)
    assert reg.records[0].status == "applied"
    assert cons.RESULT == ("w", "orig")
    parent = sys.modules[f"{scratch.package}.workers"]
    assert type(parent) is type(sys)  # the temporary watcher class on the parent package is gone
    assert parent.megatron_like is sys.modules[worker]


def test_unimportable_target_is_recorded_unavailable(scratch, make_registry):
    broken = scratch.write("broken", "import vpt_this_module_does_not_exist\ndef f():\n    return 1\n")
    reg = make_registry(
        [
            patch("u1", f"{broken}:f", replacement=lambda: new_f),
            patch("u2", "vpt_no_such_top_level.mod:f", replacement=lambda: new_f),
        ]
    )
    assert [r.status for r in reg.records] == ["pending", "pending"]
    reg.resolve_pending()
    by = {r.patch.name: r for r in reg.records}
    assert by["u1"].status == "unavailable"
    assert "ModuleNotFoundError" in by["u1"].detail and "vpt_this_module_does_not_exist" in by["u1"].detail
    assert f"cannot import {broken} on this host" in by["u1"].detail
    assert by["u2"].status == "unavailable" and "vpt_no_such_top_level" in by["u2"].detail
    assert "2 unavailable" in reg.summary_line()


def test_replacement_that_cannot_import_is_unavailable_not_a_crash(mods, make_registry):
    pkg, mod, _ = mods

    def needs_npu():
        import vpt_torch_npu_stand_in_missing  # noqa: F401

        return new_f

    reg = make_registry([patch("needs", f"{pkg}.mod:f", replacement=needs_npu)])
    rec = reg.records[0]
    assert rec.status == "unavailable" and "vpt_torch_npu_stand_in_missing" in rec.detail
    assert mod.f() == "orig-f"


# ---- idempotence and revert -------------------------------------------------------------------
def test_activate_twice_changes_nothing(mods, make_registry):
    pkg, mod, _ = mods
    calls: list[str] = []
    reg = make_registry([patch("w", f"{pkg}.mod:g", Kind.WRAP, replacement=tag_wrap("w", calls))])
    wrapped = mod.g
    assert reg.activate() is reg
    assert mod.g is wrapped
    assert mod.g(0) == ("w", ("orig-g", 0)) and calls == ["w"]  # wrapped once, not twice


def test_second_registry_sees_the_marker_and_changes_nothing(mods, make_registry):
    pkg, mod, user = mods
    calls: list[str] = []
    declared = [
        patch("w", f"{pkg}.mod:g", Kind.WRAP, replacement=tag_wrap("w", calls)),
        patch("r", f"{pkg}.mod:f", replacement=lambda: lambda: "replaced"),
        patch("k", f"{pkg}.mod:TABLE", Kind.REGISTRY, replacement=lambda: 5, registry_key=("a",)),
    ]
    first = make_registry(declared)
    g1, f1 = mod.g, mod.f
    second = make_registry(declared)
    assert mod.g is g1 and mod.f is f1 and user.f is f1
    assert [r.status for r in second.records][:2] == ["applied", "applied"]
    assert second.records[0].detail.startswith("already in place")
    assert mod.g(1) == ("w", ("orig-g", 1)) and calls == ["w"]
    # Reverting the second registry must not undo (or break on) what the first one installed.
    second.revert()
    assert mod.g is g1 and mod.f is f1
    first.revert()
    assert mod.g(1) == ("orig-g", 1) and mod.f() == "orig-f" and user.f() == "orig-f"


def test_revert_restores_every_original_and_rebinding(mods, make_registry):
    pkg, mod, user = mods
    originals = {"f": mod.f, "g": mod.g, "m": mod.C.__dict__["m"], "s": mod.C.__dict__["s"], "c": mod.C.__dict__["c"]}
    reg = make_registry(
        [
            patch("f", f"{pkg}.mod:f", replacement=lambda: new_f),
            patch("g1", f"{pkg}.mod:g", Kind.WRAP, replacement=tag_wrap("g1")),
            patch("g2", f"{pkg}.mod:g", Kind.WRAP, replacement=tag_wrap("g2")),  # stacked on g1
            patch("m", f"{pkg}.mod:C.m", Kind.WRAP, replacement=tag_wrap("m")),
            patch("s", f"{pkg}.mod:C.s", Kind.WRAP, replacement=tag_wrap("s")),
            patch("c", f"{pkg}.mod:C.c", Kind.WRAP, replacement=tag_wrap("c")),
            patch("added", f"{pkg}.mod:brand_new", replacement=lambda: new_f),
        ]
    )
    assert mod.g(0) == ("g2", ("g1", ("orig-g", 0)))
    assert user.renamed_g is mod.g  # the stale copy follows the stack to the newest wrapper
    assert mod.brand_new is new_f
    reg.revert()
    assert mod.f is originals["f"] and user.f is originals["f"]
    assert mod.g is originals["g"] and user.renamed_g is originals["g"]
    for name in ("m", "s", "c"):
        assert mod.C.__dict__[name] is originals[name]
    assert not hasattr(mod, "brand_new")
    assert {r.status for r in reg.records} == {"reverted"}
    assert reg._hook not in sys.meta_path and not reg.active


def test_revert_removes_the_hook_so_later_imports_are_untouched(scratch, make_registry):
    late = scratch.write("late", "def f():\n    return 'orig'\n")
    reg = make_registry([patch("p", f"{late}:f", replacement=lambda: new_f)])
    assert reg._hook in sys.meta_path
    reg.revert()
    assert reg._hook not in sys.meta_path
    assert importlib.import_module(late).f() == "orig"


# ---- conditions -------------------------------------------------------------------------------
def test_device_condition_skips_with_reason(mods, make_registry):
    pkg, mod, _ = mods
    reg = make_registry(
        [
            patch("npu-only", f"{pkg}.mod:f", replacement=lambda: new_f, devices=("npu",)),
            patch("cpu-only", f"{pkg}.mod:g", replacement=lambda: new_f, devices=("cpu",)),
        ],
        device="cpu",
    )
    by = {r.patch.name: r for r in reg.records}
    assert by["npu-only"].status == "skipped" and by["npu-only"].detail == "device is cpu; applies on npu"
    assert mod.f() == "orig-f"
    assert by["cpu-only"].status == "applied" and mod.g is new_f


def test_env_flag_condition(mods, make_registry, monkeypatch):
    pkg, mod, _ = mods
    monkeypatch.delenv("VERL_PATCHES_ROLLOUT_STANDIN", raising=False)
    declared = [patch("flagged", f"{pkg}.mod:f", replacement=lambda: new_f, env_flag="VERL_PATCHES_ROLLOUT_STANDIN")]
    off = make_registry(declared)
    assert off.records[0].status == "skipped" and off.records[0].detail == "VERL_PATCHES_ROLLOUT_STANDIN is off"
    assert mod.f() == "orig-f"
    off.revert()
    monkeypatch.setenv("VERL_PATCHES_ROLLOUT_STANDIN", "1")
    on = make_registry(declared)
    assert on.records[0].status == "applied" and mod.f is new_f


# ---- manifest ---------------------------------------------------------------------------------
def test_manifest_is_data_and_summary_is_one_line(mods, make_registry):
    pkg, _, _ = mods
    reg = make_registry(
        [
            patch("a", f"{pkg}.mod:f", replacement=lambda: new_f),
            patch("b", f"{pkg}.mod:g", replacement=lambda: new_f, devices=("npu",)),
            patch("c", f"{pkg}.not_yet:f", replacement=lambda: new_f),
        ]
    )
    man = reg.manifest()
    assert [(m["name"], m["status"]) for m in man] == [("a", "applied"), ("b", "skipped"), ("c", "pending")]
    keys = {
        "name",
        "target",
        "kind",
        "vendor_item",
        "reason",
        "devices",
        "condition",
        "status",
        "detail",
        "declared_fingerprint",
        "found_fingerprint",
        "rebound",
        "pid",
    }
    assert all(keys <= set(m) for m in man)
    assert {m["pid"] for m in man} == {os.getpid()}
    assert man[0]["kind"] == "replace" and man[1]["devices"] == ["npu"]
    line = reg.summary_line()
    assert "\n" not in line
    assert line == (
        f"verl_patches active in pid {os.getpid()} (device=cpu): 3 declared: 1 applied, 1 pending, 1 skipped"
    )
