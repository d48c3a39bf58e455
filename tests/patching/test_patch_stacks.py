"""Patch stacks: which patches share an upstream target and in what order they run, pinned.

The order is the catalog's; nothing else records it. `STACKS` below is the order reviewed: a catalog change
that reorders a stack fails here first. The derivation (`verl_patches.patching.stacks`) is checked on small
catalogs, the registry's own application on the real upstream objects is checked to run the layers in the
printed order on every device, and the real replacements' `calls_original` declarations are checked against
what the applied objects actually close over.
"""

from __future__ import annotations

import importlib

import pytest

from patching_testlib import run_json
from verl_patches.patches.catalog import all_patches
from verl_patches.patching.declaration import DEVICES, Kind, Patch, PatchError
from verl_patches.patching.stacks import layers_on, patch_stacks, render_stacks, stack_entries

_W = "verl.workers.megatron_workers:ActorRolloutRefWorker"
_SPMD = "verl.workers.rollout.vllm_rollout.vllm_rollout_spmd"
ALL = ("npu", "cuda", "cpu")

# target -> {devices: layers, outermost first}; "upstream" ends a stack whose innermost layer calls upstream's object
STACKS = {
    "apex.optimizers": {
        ("npu",): ["apex.optimizers.module_for_npu"],
        ("cpu",): ["cpu.apex.optimizers.module"],
    },
    f"{_W}.generate_sequences": {
        ALL: [
            "megatron_worker.generate_sequences_progress",
            "megatron_worker.generate_sequences_d2d_cache",
            "timing.megatron_workers.generate_sequences",
            "upstream",
        ],
    },
    f"{_SPMD}:LLM": {
        ("npu",): ["verl.vllm_rollout_spmd.LLM.lifecycle"],  # vllm-ascend's engine
        ("cpu",): ["cpu.verl.vllm_rollout_spmd.LLM.lifecycle"],  # the same on the emulated npu: the tiny run's
        ("cpu", "VERL_PATCHES_ROLLOUT_STANDIN=1"): ["cpu.verl.vllm_rollout_spmd.LLM.standin"],  # tests only
    },
    f"{_SPMD}:vLLMRollout.__init__": {
        ("npu", "cpu"): [
            "verl.vllm_rollout_spmd.vLLMRollout.__init__.dp_env_and_compile",
            "verl.vllm_rollout_spmd.vLLMRollout.__init__.a3_checks",
        ],
    },
    f"{_W}.save_checkpoint": {
        ALL: ["megatron_worker.save_checkpoint_progress", "checkpoint.megatron_worker.save_without_barrier"],
    },
    f"{_W}.init_model": {
        ALL: ["megatron_worker.init_model_progress", "megatron_worker.init_model"],
    },
    f"{_W}.update_actor": {
        ALL: [
            "megatron_worker.update_actor_progress",
            "megatron_worker.update_actor_d2d_cache",
            "megatron_worker.update_actor_temperature",
            "checkpoint.megatron_worker.fence_before_update",  # innermost: the wait is the update's own
            "upstream",
        ],
    },
    f"{_W}.compute_ref_log_prob": {
        ALL: [
            "megatron_worker.compute_ref_log_prob_progress",
            "megatron_worker.compute_ref_log_prob_d2d_cache",
            "upstream",
        ],
    },
}


def _as_table(stacks) -> dict:
    table: dict = {}
    for s in stacks:
        table.setdefault(s.target, {})[s.devices + s.switches] = [p.name for p in s.layers] + (
            ["upstream"] if s.calls_upstream else []
        )
    return table


# ---- the catalog's stacks, pinned -----------------------------------------------------------------
def test_every_multi_patched_target_has_its_reviewed_stack():
    stacks = patch_stacks(all_patches())
    assert _as_table(stacks) == STACKS
    assert [s for s in stacks if s.hidden] == [], "a layer that never runs: fix the catalog order"


def test_the_audit_text_prints_each_stack_outermost_first():
    lines = render_stacks(stack_entries(patch_stacks(all_patches())))
    text = "\n".join(lines)
    for target, by_devices in STACKS.items():
        start = lines.index(target)
        for devices, layers in by_devices.items():
            on = [d for d in devices if "=" not in d]
            switched = "".join(f" with {d}" for d in devices if "=" in d)
            header = lines.index(f"  on {','.join(on)}{switched}:", start)
            names = [n for n in layers if n != "upstream"]
            for i, name in enumerate(names, 1):
                assert lines[header + i].startswith(f"    {i}. {name} "), (target, devices, lines[header + i])
            tail = lines[header + len(names) + 1]
            assert ("then upstream's" in tail) == (layers[-1] == "upstream"), tail
    assert "never run" not in text


# ---- the derivation, on small catalogs ----------------------------------------------------------
def _p(name: str, kind: Kind = Kind.WRAP, devices=DEVICES, **kw) -> Patch:
    return Patch(
        name=name,
        target="pkg.mod:f",
        kind=kind,
        fingerprint="",
        vendor_item="local",
        reason="test",
        devices=devices,
        replacement=kw.pop("replacement", lambda *a: None),
        **kw,
    )


def test_later_wraps_are_outer_and_devices_split_the_stack():
    a, b, c = _p("a"), _p("b", devices=("npu",)), _p("c")
    assert [p.name for p in layers_on([a, b, c], "npu")[0]] == ["c", "b", "a"]
    assert [p.name for p in layers_on([a, b, c], "cpu")[0]] == ["c", "a"]
    [npu, rest] = patch_stacks([a, b, c])
    assert (npu.devices, rest.devices) == (("npu",), ("cuda", "cpu"))
    assert npu.calls_upstream and rest.calls_upstream


def test_a_new_body_or_a_replace_over_other_layers_hides_them():
    a, body = _p("a"), _p("body", calls_original=False)
    [s] = patch_stacks([a, body])
    assert [p.name for p in s.layers] == ["body"] and [p.name for p in s.hidden] == ["a"]
    assert not s.calls_upstream
    [ok] = patch_stacks([body, a])  # the new body innermost: nothing hidden, `a` runs around it
    assert [p.name for p in ok.layers] == ["a", "body"] and ok.hidden == ()
    [r] = patch_stacks([a, _p("r", Kind.REPLACE)])
    assert [p.name for p in r.hidden] == ["a"]
    assert "    !! never run (covered by a later layer; fix the catalog order): a" in render_stacks(stack_entries([r]))


def test_a_switched_alternative_is_its_own_stack_and_hides_nothing():
    """A REPLACE behind an opt-in switch over an always-on one: without the switch the default layering; with
    it, the alternative alone on the devices it changes, listed under the switch, not reported as hidden."""
    base = _p("engine", Kind.REPLACE, devices=("npu", "cpu"))
    alt = _p("double", Kind.REPLACE, devices=("cpu",), env_flag="DOUBLE")
    stacks = patch_stacks([base, alt])
    assert [(s.devices, [p.name for p in s.layers], s.hidden, s.switches) for s in stacks] == [
        (("npu", "cpu"), ["engine"], (), ()),
        (("cpu",), ["double"], (), ("DOUBLE=1",)),
    ]
    assert "  on cpu with DOUBLE=1:" in render_stacks(stack_entries(stacks))
    on_by_default = _p("w", devices=("cpu",), env_flag="OFF_SWITCH", env_default=True)
    assert [(s.devices, [p.name for p in s.layers], s.switches) for s in patch_stacks([base, on_by_default])] == [
        (("npu",), ["engine"], ()),
        (("cpu",), ["w", "engine"], ()),
        (("cpu",), ["engine"], ("OFF_SWITCH=0",)),  # a switch on by default is turned off
    ]


def test_calls_original_false_is_only_for_wraps():
    with pytest.raises(ValueError, match="calls_original=False is for a WRAP patch"):
        _p("r", Kind.REPLACE, calls_original=False)


def test_registry_refuses_a_new_body_over_an_applied_patch(scratch, make_registry):
    calls: list[str] = []

    def around(original):
        def f():
            calls.append("around")
            return original()

        return f

    def new_body(original):
        def f():
            calls.append("body")
            return "ours"

        return f

    def pair(mod: str) -> tuple[Patch, Patch]:
        common = dict(target=f"{mod}:f", kind=Kind.WRAP, fingerprint="", vendor_item="local", reason="test")
        return Patch(name="around", replacement=around, **common), Patch(
            name="body", replacement=new_body, calls_original=False, **common
        )

    bad = importlib.import_module(scratch.write("bad", "def f():\n    return 'upstream'\n"))
    wrap, body = pair(bad.__name__)
    with pytest.raises(PatchError, match="'body' gives .*:f a new body .* patch 'around', applied before it, would"):
        make_registry([wrap, body])
    assert bad.f() == "upstream" and calls == ["around"]  # only the wrap beneath applied

    calls.clear()
    good = importlib.import_module(scratch.write("good", "def f():\n    return 'upstream'\n"))
    wrap, body = pair(good.__name__)
    reg = make_registry([body, wrap])
    assert [r.status for r in reg.records] == ["applied", "applied"]
    assert good.f() == "ours" and calls == ["around", "body"]


# ---- the registry on the real upstream objects, every device --------------------------------------
RUNTIME_SCRIPT = r"""
import dataclasses, json, os, sys, types
from verl_patches.patching import registry as R
from verl_patches.patching.declaration import DEVICES, Kind
from verl_patches.patching.stacks import patch_stacks
from verl_patches.patches.catalog import all_patches
import verl.workers.megatron_workers as mw                    # activates the real catalog (the prelude line)
import verl.workers.rollout.vllm_rollout.vllm_rollout_spmd  # noqa: F401
real = R.get_registry()
out = {"calls_original": {}, "save_checkpoint": None, "runs": {}}

# 1. every applied wrap that returns a function: does it close over what it wrapped (i.e. can it call it)?
def closes_over(new, old):
    cells = [c.cell_contents for c in (getattr(new, "__closure__", None) or ()) if c is not None]
    return any(c is old for c in cells)
for rec in real.records:
    if rec.patch.kind is Kind.WRAP and rec.status == "applied" and isinstance(R._unwrap(rec.new), types.FunctionType):
        out["calls_original"][rec.patch.name] = [rec.patch.calls_original,
                                                 closes_over(R._unwrap(rec.new), R._unwrap(rec.original))]

# 2. the real save_checkpoint stack: the progress wrap runs around our body
from verl_patches.resilience import progress
seen = []
progress.enter_call = lambda call, step, phase: seen.append(("enter", call))
progress.leave_call = lambda: seen.append(("leave",))
class Manager:
    def save_checkpoint(self, **kw):
        seen.append(("save", kw["local_path"]))
worker = types.SimpleNamespace(_is_offload_param=False, checkpoint_mananager=Manager())
mw.ActorRolloutRefWorker.save_checkpoint(worker, "/ckpt/step_1")
out["save_checkpoint"] = seen

# 3. recorder layers, applied by the registry itself on the pristine upstream objects, per device
real.revert()
stacked = {s.target for s in patch_stacks(all_patches())}
calls = []

def wrap_layer(name, calls_original, upstream):
    def factory(inner):
        def layer(*a, **k):
            calls.append(name)
            if not calls_original:
                return None
            if getattr(inner, "_vpt_layer", False):
                return inner(*a, **k)
            calls.append("upstream" if inner is upstream else f"other: {inner!r}")
        layer._vpt_layer = True
        return layer
    return factory

def leaf(name):
    def layer(*a, **k):
        calls.append(name)
    return lambda: layer

def resolve(target):
    module, _, qual = target.partition(":")
    owner = sys.modules[module]
    for part in qual.split(".")[:-1]:
        owner = getattr(owner, part)
    slot = qual.split(".")[-1]
    return owner, slot, (owner.__dict__[slot] if isinstance(owner, type) else getattr(owner, slot))

switched = {(s.target, s.switches[0]) for s in patch_stacks(all_patches()) if s.switches}
out["runs_switched"] = {}
for target, switch in [(t, None) for t in sorted(stacked)] + sorted(switched):
    group = [p for p in all_patches() if p.target == target]
    if switch is None:
        runs = out["runs"].setdefault(target, {})
    else:
        runs = out["runs_switched"].setdefault(switch, {}).setdefault(target, {})
    if switch is not None:
        os.environ[switch.partition("=")[0]] = switch.partition("=")[2]
    for device in DEVICES:
        if group[0].kind is Kind.MODULE_ALIAS:
            reg = R.Registry(group, device).activate()
            alias = sys.modules.get(target)
            runs[device] = [getattr(alias, R.MARKER)] if alias is not None else []
            reg.revert()
            continue
        upstream = R._unwrap(resolve(target)[2])
        recorders = [
            dataclasses.replace(p, replacement=wrap_layer(p.name, p.calls_original, upstream))
            if p.kind is Kind.WRAP else dataclasses.replace(p, replacement=leaf(p.name))
            for p in group
        ]
        reg = R.Registry(recorders, device).activate()
        calls.clear()
        now = R._unwrap(resolve(target)[2])
        if now is upstream:
            runs[device] = []
        else:
            now(None, None) if ":" in target and "." in target.partition(":")[2] else now()
            runs[device] = list(calls)
        reg.revert()
        assert R._unwrap(resolve(target)[2]) is upstream, target
    if switch is not None:
        del os.environ[switch.partition("=")[0]]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runtime():
    return run_json(RUNTIME_SCRIPT, env={"VERL_PATCHES_QUIET": "1"}, timeout=300)[0]


@pytest.mark.slow  # shares one fresh interpreter importing verl's Megatron worker: about 40 s
def test_calling_each_target_runs_its_layers_in_the_printed_order_on_every_device(runtime):
    expected = {target: {d: [] for d in DEVICES} for target in STACKS}
    switched: dict = {}
    for target, by_devices in STACKS.items():
        for devices, layers in by_devices.items():
            switches = [d for d in devices if "=" in d]
            if not switches:
                for d in devices:
                    expected[target][d] = layers
    for target, by_devices in STACKS.items():  # with a switch on, the devices it changes; others as without
        for devices, layers in by_devices.items():
            for switch in [d for d in devices if "=" in d]:
                runs = switched.setdefault(switch, {}).setdefault(target, dict(expected[target]))
                for d in devices:
                    if "=" not in d:
                        runs[d] = layers
    assert runtime["runs"] == expected
    assert runtime["runs_switched"] == switched


@pytest.mark.slow  # shares one fresh interpreter importing verl's Megatron worker: about 40 s
def test_calls_original_declarations_match_what_the_real_wraps_close_over(runtime):
    found = runtime["calls_original"]
    assert "checkpoint.megatron_worker.save_without_barrier" in found and "megatron_worker.init_model" in found
    wrong = {name: declared for name, (declared, closes) in found.items() if declared != closes}
    assert wrong == {}, f"calls_original declared wrongly (declared value shown): {wrong}"


@pytest.mark.slow  # shares one fresh interpreter importing verl's Megatron worker: about 40 s
def test_real_save_checkpoint_runs_the_progress_layer_around_our_body(runtime):
    assert runtime["save_checkpoint"] == [
        ["enter", "save_checkpoint"],
        ["save", "/ckpt/step_1"],
        ["leave"],
    ]
