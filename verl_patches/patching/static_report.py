"""Every declared patch and whether it still fits the locked upstream source, without importing it.

Used by the audit and the preflight: fingerprints are computed from the vendored files under the repo
root, so the answer is available on any host, NPU-only targets included, before anything starts.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_patches.device import device_kind
from verl_patches.patching.declaration import ABSENT, Kind, Patch
from verl_patches.patching.fingerprint import FingerprintError, fingerprint_target, module_file, source_nodes
from verl_patches.patching.registry import UPSTREAM_ROOTS, lock_pin


def _installed_version(top: str) -> str:
    for dist in (top, top.replace("_", "-")):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "?"


def _status_outside_lock(patch: Patch, targets: tuple[str, ...], module: str, device: str) -> tuple[str, str, str]:
    """Targets in packages the requirements files pin (torch, transformers): checked against what is
    installed here, and a mismatch only counts as drift where the patch would apply."""
    top = module.partition(".")[0]
    if not patch.fingerprint or patch.fingerprint == ABSENT:
        what = "stands in for a package" if patch.kind is Kind.MODULE_ALIAS else "targets a package"
        return "unpinned", "", f"{what} outside sources.lock ({module}); nothing pinned to fingerprint"
    try:
        found = fingerprint_target(*targets)
    except FingerprintError as e:
        return "unpinned", "", f"{top} is not installed here ({e}); checked where the patch applies"
    installed = f"installed {top} {_installed_version(top)}"
    if found == patch.fingerprint:
        return "ok", found, f"matches the {installed} (pinned by the requirements files)"
    if device in patch.devices:
        return "drift", found, f"declared {patch.fingerprint}, the {installed} has {found}"
    return "unpinned", found, f"differs from the {installed}, but the patch applies only on {','.join(patch.devices)}"


def _status(patch: Patch, root: Path, device: str) -> tuple[str, str, str]:
    """(status, pin fingerprint, detail)."""
    targets = patch.fingerprint_targets
    module = targets[0].partition(":")[0]
    if module.partition(".")[0] not in UPSTREAM_ROOTS:
        return _status_outside_lock(patch, targets, module, device)
    pin = lock_pin(module)
    source = module_file(module, root)
    if source is None:
        return "target-missing", "", f"{module} not found under {root} (component not set up here?) — {pin}"
    if patch.fingerprint == ABSENT and not patch.fingerprint_of:
        try:
            source_nodes(source, patch.qualname)
        except FingerprintError:
            return "ok", ABSENT, f"adds {patch.qualname}, absent at {pin} as expected"
        return "drift", "present", f"adds {patch.qualname}, but {pin} defines it"
    try:
        found = fingerprint_target(*targets, root=root)
    except FingerprintError as e:
        return "target-missing", "", f"{e} — {pin}"
    if found != patch.fingerprint:
        return "drift", found, f"declared {patch.fingerprint}, {pin} has {found}"
    return "ok", found, f"matches {pin}"


def _relied_on_status(target: str, declared: str, root: Path) -> dict[str, Any]:
    """One upstream object a replacement calls by name, checked like a target (vendored tree, else installed)."""
    module = target.partition(":")[0]
    in_lock = module.partition(".")[0] in UPSTREAM_ROOTS
    where = lock_pin(module) if in_lock else f"the installed {module.partition('.')[0]}"
    entry = {"target": target, "declared_fingerprint": declared, "pin_fingerprint": ""}
    try:
        found = fingerprint_target(target, root=root) if in_lock else fingerprint_target(target)
    except FingerprintError as e:
        return {**entry, "status": "target-missing", "detail": f"relies on {target}: {e} — {where}"}
    if found != declared:
        detail = f"relies on {target}: declared {declared}, {where} has {found}"
        return {**entry, "pin_fingerprint": found, "status": "drift", "detail": detail}
    return {**entry, "pin_fingerprint": found, "status": "ok", "detail": f"matches {where}"}


def _with_relied_on(status: tuple[str, str, str], relied: list[dict[str, Any]]) -> tuple[str, str, str]:
    """The patch's status, made worse by any object it relies on that drifted or is missing (named in the detail)."""
    bad = [r for r in relied if r["status"] != "ok"]
    if not bad:
        return status
    state, found, detail = status
    if state == "ok":
        state = "drift" if any(r["status"] == "drift" for r in bad) else "target-missing"
    return state, found, "; ".join([detail, *(r["detail"] for r in bad)])


def static_patch_report(root: Path, patches: Sequence[Patch], device: str | None = None) -> list[dict[str, Any]]:
    """Each of ``patches`` (the catalog, handed in by the audit or the preflight) against the pinned sources
    under ``root``, without importing them."""
    if device is None:
        device = device_kind()
    out = []
    for p in patches:
        relied = [_relied_on_status(t, fp, Path(root)) for t, fp in p.relies_on]
        status, found, detail = _with_relied_on(_status(p, Path(root), device), relied)
        out.append(
            {
                "name": p.name,
                "target": p.target,
                "kind": p.kind.value,
                "vendor_item": p.vendor_item,
                "reason": p.reason,
                "devices": list(p.devices),
                "condition": p.condition_text(),
                "declared_fingerprint": p.fingerprint,
                "pin_fingerprint": found,
                "status": status,
                "detail": detail,
                "relies_on": relied,
            }
        )
    return out
