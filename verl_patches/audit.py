"""`python -m verl_patches.audit`: every difference from upstream, on disk and at runtime, in one report.

On disk: per component the pin, the route used, whether the folder matches the lock, and a unified diff
against the pristine upstream copy (today exactly the one inserted prelude line). At runtime: every
declared patch with its target, vendor item, fingerprint status at the locked pin (computed from the
vendored sources without importing them or starting anything) and the devices it applies on.

JSON schema (stable; fields are only ever added): {"schema": "verl-overlay-audit/1", "lock", "device",
"components": [{"name", "package", "ref", "commit", "pypi_file", "needed_on", "optional_here", "route",
"origin_route", "status": "match|mismatch|missing", "expected_tree_sha256": {route: sha},
"found_tree_sha256", "differences": {"changed"|"added"|"removed": [path]}, "problems": [str],
"prelude": {"file", "expected", "in_place"} | null, "diff": str, "diff_unavailable": [path]}],
"patches": [{"name", "target", "kind", "vendor_item", "reason", "devices", "condition",
"declared_fingerprint", "pin_fingerprint", "status": "ok|drift|target-missing|unpinned|unreadable",
"detail", "relies_on": [{"target", "declared_fingerprint", "pin_fingerprint", "status", "detail"}]}],
"patch_stacks": [{"target", "devices", "layers": [{"name", "kind", "vendor_item", "calls_original"}] (outermost
first), "calls_upstream", "hidden": [name]}], "summary": {"components_matching", "components_total",
"diff_lines", "patches_total", "patches_ok", "patches_drift", "patches_unpinned", "patch_stacks",
"patch_layers_hidden"}, "distributions": [{"component", "distribution", "version", "folder",
"status": "match|mismatch|missing|unverified", "entry_points": {group: {name: target}}, "problems"}],
"weight_sync": {"path": "all-to-all|all-gather|invalid", "flag", "detail"},
"hang_diagnosis": {"timeout": {"variable", "value", "set_by"}, "driver", "heartbeat", "progress_points":
[{"point", "where", "frequency"}], "not_watched": [{"what", "why"}], "npu", "fault_injection"},
"package_versions": {"line", "cpu_host", "differences": [{"name", "pinned", "installed", "note"}]},
"npu_emulation": {"site", "packages", "active_in_this_process", "applies_when", "emulated_ops": [{"name",
"provider", "implementation", "reference", "wheel_ops"}], "cpu_limits": [{"feature", "reason"}], "wheel": {"file",
"sha256", "url", "path", "status", "detail"}, "contract": [{"op", "schema", "meta", "has_wheel_meta"}],
"schema_changes": [{"op", "reason"}], "meta_disagreements": [{"op", "outputs", "when", "reason"}],
"cpu_proof_exceptions": [{"name", "deviation", "switch", "owner", "in_effect"}]}}
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

# Everything the audit reads is standard library only at import time: it runs before anything is installed.
from verl_patches.base.host_device import DeviceSettingError, detect_host_device
from verl_patches.npu_emulation import emulation_report, emulation_report_text
from verl_patches.patches import catalog
from verl_patches.patching.stacks import patch_stacks, render_stacks, stack_entries
from verl_patches.patching.static_report import static_patch_report
from verl_patches.resilience.watched import render as render_watched
from verl_patches.resilience.watched import watched
from verl_patches.sources import __main__ as setup_cli  # setup_sources.sh's options, for --audit
from verl_patches.sources import pins
from verl_patches.sources.dist_info import render as render_dists
from verl_patches.sources.dist_info import report as dist_report
from verl_patches.sources.lock import Lock, LockError, load_lock
from verl_patches.sources.report import AUDIT_SCHEMA, exit_status, sources_report
from verl_patches.sync.path import describe_sync_path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _changed_lines(diff: str) -> int:
    return sum(1 for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---")))


def full_report(
    root: Path, lock: Lock, device: str, names: list[str] | None = None, sources: dict | None = None
) -> dict:
    sources = sources or sources_report(root, lock, device, names, with_diff=True)
    declared = catalog.all_patches()
    patches = static_patch_report(root, declared, device)
    stacks = stack_entries(patch_stacks(declared))
    return {
        "schema": AUDIT_SCHEMA,
        "lock": sources["lock"],
        "device": device,
        "components": sources["components"],
        "patches": patches,
        "patch_stacks": stacks,
        "distributions": sources.get("distributions") or _distributions(root, lock, names),
        "weight_sync": _weight_sync(),
        "hang_diagnosis": _hang_diagnosis(),
        "package_versions": _package_versions(device),
        "summary": {
            "components_matching": sum(c["status"] == "match" for c in sources["components"]),
            "components_total": len(sources["components"]),
            "diff_lines": sum(_changed_lines(c["diff"]) for c in sources["components"]),
            "patches_total": len(patches),
            "patches_ok": sum(p["status"] == "ok" for p in patches),
            "patches_drift": sum(p["status"] == "drift" for p in patches),
            "patches_unpinned": sum(p["status"] == "unpinned" for p in patches),
            "patch_stacks": len({s["target"] for s in stacks}),
            "patch_layers_hidden": sum(len(s["hidden"]) for s in stacks),
        },
    }


def _weight_sync() -> dict:
    return describe_sync_path()


def _hang_diagnosis() -> dict:
    return watched()


def _package_versions(device: str) -> dict:
    """Installed versions against requirements.txt (the A3 job's pins): a proof on other versions is a
    proof of another stack, so the audit says which differ. The host kind comes from the audit's own
    torch-free detection: the audit runs before anything is installed."""
    cpu_host = device == "cpu"
    line, found = pins.check(cpu_host=cpu_host)
    return {"line": line, "cpu_host": cpu_host, "differences": [asdict(d) for d in found]}


def _distributions(root: Path, lock: Lock, names: list[str] | None) -> list[dict]:
    return dist_report(root, lock, names)


def render_text(report: dict) -> str:
    out = [f"Audit of {report['lock']} on a {report['device']} host", "", "== On disk (upstream folders)"]
    for c in report["components"]:
        status = c["status"].upper() + (
            " (optional on this host)" if c["status"] == "missing" and c["optional_here"] else ""
        )
        out.append(
            f"{c['name']:<14} {status:<10} {c['ref']} @ {c['commit'][:12]}"
            f"{'  pypi ' + c['pypi_file'] if c['pypi_file'] else ''}  route={c['route'] or '-'}"
        )
        out += [f"    {p}" for p in c["problems"]]
        if c["diff"]:
            out += ["    " + line for line in c["diff"].rstrip("\n").splitlines()]
        for rel in c["diff_unavailable"]:
            out.append(f"    (no pristine copy in the cache to diff {c['package']}/{rel}; run setup_sources.sh again)")
    if report.get("distributions"):
        out += [
            "",
            "== Generated distribution metadata (.dist-info folders outside every upstream folder)",
            render_dists(report["distributions"]),
        ]
    if report.get("weight_sync"):
        w = report["weight_sync"]
        out += ["", "== Weight sync (Megatron -> rollout)", f"{w['path']} ({w['flag']}): {w['detail']}"]
    if report.get("hang_diagnosis"):
        out += ["", "== Hang diagnosis (what is watched and how)"] + render_watched(report["hang_diagnosis"])
    if report.get("package_versions"):
        out += ["", "== Installed Python packages (requirements.txt)", report["package_versions"]["line"]]
    out += ["", "== At runtime (declared patches)"]
    for p in report["patches"]:
        out.append(f"{p['status'].upper():<14} {p['vendor_item']:<6} {p['kind']:<13} {p['target']}")
        out.append(
            f"{'':<14} {p['name']}: {p['reason']} [devices: {','.join(p['devices'])}"
            f"{'; ' + p['condition'] if p['condition'] else ''}]"
        )
        if p["status"] != "ok":
            out.append(f"{'':<14} {p['detail']}")
        if p.get("relies_on"):
            n = len(p["relies_on"])
            matching = sum(r["status"] == "ok" for r in p["relies_on"])
            out.append(f"{'':<14} relies on {n} more upstream object(s), each pinned: {matching}/{n} match")
    if report.get("patch_stacks"):
        out += [
            "",
            "== Patch stacks (upstream targets with more than one patch: outermost layer first, as a call "
            "passes through them)",
        ] + render_stacks(report["patch_stacks"])
    s = report["summary"]
    out += [
        "",
        f"summary: {s['components_matching']}/{s['components_total']} components match the lock; "
        f"{s['diff_lines']} changed line(s) on disk; {s['patches_total']} patches: {s['patches_ok']} match "
        f"their pinned fingerprints, {s['patches_drift']} drifted, {s['patches_unpinned']} target code "
        f"outside the lock; {s.get('patch_stacks', 0)} upstream target(s) carry more than one patch (stacks above)"
        + (f", {s['patch_layers_hidden']} layer(s) covered and never run" if s.get("patch_layers_hidden") else ""),
    ]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_patches.audit", description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="machine-readable report (schema in the module doc)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="components to report (default: all)")
    p.add_argument("--lock", type=Path, default=REPO_ROOT / "sources.lock")
    args = p.parse_args(argv)
    lock = load_lock(args.lock)
    report = full_report(args.lock.parent.resolve(), lock, detect_host_device(), args.only)
    report["npu_emulation"] = emulation_report()  # emulated torch_npu ops, MindSpeed features CPU cannot run
    print(
        json.dumps(report, indent=2)
        if args.json
        else render_text(report) + emulation_report_text(report["npu_emulation"])
    )
    return audit_exit_status(report)


def setup_sources_main(argv: list[str]) -> int:
    """`setup_sources.sh --audit [--json] [--only NAME ...] [--lock FILE] [--root DIR]`: this report, read with the
    setup command's own options and messages. setup_sources.sh hands ``--audit`` here, so that the sources
    package, a layer below, never imports the audit."""
    args = setup_cli.parse_args(argv)
    try:
        lock, root, device = setup_cli.lock_root_device(args)
    except (LockError, DeviceSettingError) as e:
        print(f"setup_sources.sh: {e}", file=sys.stderr)
        return setup_cli.EXIT_USAGE
    sources = sources_report(root, lock, device, args.only, with_diff=True)
    sources["distributions"] = dist_report(root, lock, args.only)  # generated .dist-info folders
    report = full_report(root, lock, device, args.only, sources=sources)
    print(json.dumps(report, indent=2) if args.json else render_text(report))
    return audit_exit_status(report)


def optional_missing_line(report: dict) -> str:
    """One line naming the components absent here that this host does not need ("" when none)."""
    names = [c["name"] for c in report["components"] if c["status"] == "missing" and c["optional_here"]]
    if not names:
        return ""
    return (
        f"audit: {', '.join(names)} not installed: optional on this {report['device']} host (the A3 job "
        f"needs {'them' if len(names) > 1 else 'it'}; without git access install from an exported cache: "
        f"bash setup_sources.sh --cache DIR)"
    )


def audit_exit_status(report: dict) -> int:
    """0 when everything this host needs matches (components only the A3 job needs may be absent: one line
    on stderr says so), 1 on any mismatch, missing needed component, drifted patch or patch
    layer that a later one covers."""
    status = exit_status(report["components"])
    if (
        report["summary"]["patches_drift"]
        or report["summary"].get("patch_layers_hidden")
        or any(d["status"] in ("missing", "mismatch") for d in report.get("distributions", []))
    ):
        return 1
    if status == 3:
        print(optional_missing_line(report), file=sys.stderr)
        return 0
    return status


if __name__ == "__main__":
    sys.exit(main())
