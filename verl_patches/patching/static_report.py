"""Every declared patch and whether it still fits the locked upstream source, without importing it.

Used by the audit and the preflight: fingerprints are computed from the vendored files under the repo
root, so the answer is available on any host, NPU-only targets included, before anything starts.
"""

from __future__ import annotations

from pathlib import Path

from verl_patches.patching.declaration import ABSENT, Kind, Patch
from verl_patches.patching.fingerprint import FingerprintError, fingerprint_target, module_file, source_nodes
from verl_patches.patching.registry import UPSTREAM_ROOTS, lock_pin


def _status(patch: Patch, root: Path) -> tuple[str, str, str]:
    """(status, pin fingerprint, detail)."""
    target = patch.fingerprint_target
    module = target.partition(":")[0]
    if module.partition(".")[0] not in UPSTREAM_ROOTS:
        what = "stands in for a package" if patch.kind is Kind.MODULE_ALIAS else "targets a package"
        return "unpinned", "", f"{what} outside sources.lock ({module}); nothing pinned to fingerprint"
    pin = lock_pin(module)
    if module_file(module, root) is None:
        return "target-missing", "", f"{module} not found under {root} (component not set up here?) — {pin}"
    if patch.fingerprint == ABSENT and not patch.fingerprint_of:
        try:
            source_nodes(module_file(module, root), patch.qualname)
        except FingerprintError:
            return "ok", ABSENT, f"adds {patch.qualname}, absent at {pin} as expected"
        return "drift", "present", f"adds {patch.qualname}, but {pin} defines it"
    try:
        found = fingerprint_target(target, root)
    except FingerprintError as e:
        return "target-missing", "", f"{e} — {pin}"
    if found != patch.fingerprint:
        return "drift", found, f"declared {patch.fingerprint}, {pin} has {found}"
    return "ok", found, f"matches {pin}"


def static_patch_report(root: Path) -> list[dict]:
    from verl_patches.patches.catalog import all_patches

    out = []
    for p in all_patches():
        status, found, detail = _status(p, Path(root))
        out.append({"name": p.name, "target": p.target, "kind": p.kind.value, "vendor_item": p.vendor_item,
                    "reason": p.reason, "devices": list(p.devices), "condition": p.condition_text(),
                    "declared_fingerprint": p.fingerprint, "pin_fingerprint": found, "status": status,
                    "detail": detail})
    return out
