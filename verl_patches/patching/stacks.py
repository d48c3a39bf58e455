"""How the patches that share an upstream target layer on it, derived from the catalog alone.

Patches on one target share its module, so the registry applies them in catalog order in one step (at
activation, or when that module finishes importing). Each WRAP wraps what the one before it left; a
REPLACE, a module alias or a WRAP that gives the target a new body (`Patch.calls_original=False`) puts
its own object there instead. So the last one applied is the outermost layer, the one a caller reaches
first. A patch applies only on its devices, so one target can layer differently per device. A patch behind an
opt-in switch (`Patch.env_flag`) applies only when the switch is turned from its default: the stack it makes is
listed apart, under that switch, and what it covers there is its purpose, not a defect (the test-only rollout
stand-in, `VERL_PATCHES_ROLLOUT_STANDIN=1`, stands in for the engine binding).

A layer that a later one puts its own object over never runs: that is a defect of the catalog order,
reported as `hidden` (the registry refuses the new-body case at runtime too).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_patches.patching.declaration import DEVICES, Kind, Patch


@dataclass(frozen=True)
class Stack:
    target: str  # "module:qualname" (a registry patch: followed by its key path)
    devices: tuple[str, ...]  # the devices on which exactly these layers apply
    layers: tuple[Patch, ...]  # outermost first: layers[0] is what callers reach, layers[-1] sits on upstream
    hidden: tuple[Patch, ...] = ()  # applied, then covered by a later layer that never calls it
    switches: tuple[str, ...] = ()  # "FLAG=value": this layering holds only with these switches turned

    @property
    def calls_upstream(self) -> bool:
        """Whether the innermost layer still runs upstream's object (a wrap that calls what it wraps)."""
        inner = self.layers[-1]
        return inner.kind is Kind.WRAP and inner.calls_original


def _target_key(p: Patch) -> str:
    return p.target + (f"[{']['.join(map(repr, p.registry_key))}]" if p.kind is Kind.REGISTRY else "")


def _covers(p: Patch) -> bool:
    """Whether `p` puts its own object over what is there (nothing beneath it runs)."""
    return p.kind is not Kind.WRAP or not p.calls_original


def _switch(flag: str, patches: Sequence[Patch]) -> str:
    """`FLAG=value` turning `flag` from its default (the default of the patches that carry it)."""
    default = next(p.env_default for p in patches if p.env_flag == flag)
    return f"{flag}={'0' if default else '1'}"


def layers_on(
    patches: Sequence[Patch], device: str, turned: frozenset[str] = frozenset()
) -> tuple[tuple[Patch, ...], tuple[Patch, ...]]:
    """(layers outermost first, hidden layers) of one target's patches, in catalog order, on `device`, with
    the switches in `turned` away from their defaults and every other switch at its default."""
    applied: list[Patch] = []  # innermost first
    hidden: list[Patch] = []
    for p in patches:
        if device not in p.devices:
            continue
        if p.env_flag and p.env_default == (p.env_flag in turned):
            continue  # its switch is off in this configuration
        if applied and _covers(p):
            if not (p.env_flag and p.env_flag in turned):  # a switch's own replacement covers by design
                hidden += applied
            applied = []
        applied.append(p)
    return tuple(reversed(applied)), tuple(hidden)


def patch_stacks(patches: Iterable[Patch]) -> list[Stack]:
    """One Stack per target with more than one patch and per distinct layering (devices grouped), in the
    order the targets first appear in the catalog."""
    by_target: dict[str, list[Patch]] = {}
    for p in patches:
        by_target.setdefault(_target_key(p), []).append(p)
    out: list[Stack] = []
    for target, group in by_target.items():
        if len(group) < 2:
            continue
        flags = sorted({p.env_flag for p in group if p.env_flag})
        for turned in [frozenset[str]()] + [frozenset([f]) for f in flags]:
            switches = tuple(_switch(f, group) for f in sorted(turned))
            layerings: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
            found: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[tuple[Patch, ...], tuple[Patch, ...]]] = {}
            for device in DEVICES:
                layers, hidden = layers_on(group, device, turned)
                if not layers or (turned and (layers, hidden) == layers_on(group, device)):
                    continue  # a switch that changes nothing on this device is not a layering of its own
                key = (tuple(p.name for p in layers), tuple(p.name for p in hidden))
                layerings.setdefault(key, []).append(device)
                found[key] = (layers, hidden)
            out += [Stack(target, tuple(devices), *found[key], switches) for key, devices in layerings.items()]
    return out


def stack_entries(stacks: Iterable[Stack]) -> list[dict[str, Any]]:
    """The audit's JSON form: {"target", "devices", "layers": [{"name", "kind", "vendor_item",
    "calls_original"}] outermost first, "calls_upstream", "hidden": [name]}."""
    return [
        {
            "target": s.target,
            "devices": list(s.devices),
            "layers": [
                {
                    "name": p.name,
                    "kind": p.kind.value,
                    "vendor_item": p.vendor_item,
                    "calls_original": p.kind is Kind.WRAP and p.calls_original,
                }
                for p in s.layers
            ],
            "calls_upstream": s.calls_upstream,
            "hidden": [p.name for p in s.hidden],
            "switches": list(s.switches),
        }
        for s in stacks
    ]


def render_stacks(entries: Sequence[dict[str, Any]]) -> list[str]:
    """Text lines: per target, per group of devices, the layers outermost first (the order a call passes them)."""
    out: list[str] = []
    previous = ""
    for s in entries:
        if s["target"] != previous:
            out.append(s["target"])
        previous = s["target"]
        switched = f" with {' '.join(s['switches'])}" if s.get("switches") else ""
        out.append(f"  on {','.join(s['devices'])}{switched}:")
        width = max(len(layer["name"]) for layer in s["layers"])
        for i, layer in enumerate(s["layers"], 1):
            how = layer["kind"] + (", new body" if layer["kind"] == "wrap" and not layer["calls_original"] else "")
            out.append(f"    {i}. {layer['name']:<{width}}  ({how}; {layer['vendor_item']})")
        last = len(s["layers"])
        upstream = s["target"].rpartition(":")[2] or s["target"]
        if s["calls_upstream"]:
            out.append(f"       then upstream's {upstream}, called by layer {last}")
        else:
            out.append(f"       upstream's {upstream} does not run: layer {last} stands in for it")
        if s["hidden"]:
            out.append(f"    !! never run (covered by a later layer; fix the catalog order): {', '.join(s['hidden'])}")
    return out
