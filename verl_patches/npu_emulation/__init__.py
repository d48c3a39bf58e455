"""CPU emulation of torch_npu (and the torchair, acl modules MindSpeed imports) for the CPU proof.

`site/` holds real packages named torch_npu, torchair and acl. `install_on_cpu_host()` puts that folder
on sys.path and PYTHONPATH, only on a CPU host and only when no real torch_npu is installed, so the
same MindSpeed / MindSpeed-LLM / vllm-ascend code that runs on A3 imports and runs here. On A3 it
does nothing. Every emulated torch_npu op keeps the pinned torch_npu wheel's contract (`wheel_contract`: its
schemas, Meta functions, documented limits and attribute set). `emulation_report()` lists every emulated
operation with where its schema and Meta function come from in that wheel, the CPU proof's declared exceptions,
and every MindSpeed feature that cannot run on a CPU host (shown by `python -m verl_patches.audit`).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

from verl_patches.base.host_device import forced_device

SITE_DIR = Path(__file__).resolve().parent / "site"
EMULATED_PACKAGES = ("torch_npu", "torchair", "acl")


def is_emulation_path(path: str | os.PathLike | None) -> bool:
    """True for a file or folder inside our stand-in site folder."""
    if not path:
        return False
    try:
        return Path(path).resolve().is_relative_to(SITE_DIR)
    except OSError:
        return False


def real_torch_npu_installed() -> bool:
    """A torch_npu that is not ours is importable (looked up on sys.path without our folder, not imported)."""
    loaded = sys.modules.get("torch_npu")
    if loaded is not None:
        return not getattr(loaded, "VERL_PATCHES_CPU_EMULATION", False)
    search = [p for p in sys.path if not is_emulation_path(p)]
    return importlib.machinery.PathFinder.find_spec("torch_npu", search) is not None


def _host_is_cpu() -> bool:
    forced = forced_device()
    if forced:
        return forced == "cpu"
    if real_torch_npu_installed():
        return False
    # lazy: asked only when neither the override nor a real torch_npu decides
    import torch

    return not torch.cuda.is_available()


def install_on_cpu_host() -> bool:
    """Make the stand-ins importable in this process and its children; True when they are (idempotent).

    A no-op (False) on an NPU or CUDA host, or when a real torch_npu is installed.
    """
    if not _host_is_cpu() or real_torch_npu_installed():
        return False
    site = str(SITE_DIR)
    if site not in sys.path:
        sys.path.insert(0, site)
        importlib.invalidate_caches()
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([site] + parts)
    return True


def is_active() -> bool:
    """The stand-in torch_npu is what `import torch_npu` gives in this process."""
    loaded = sys.modules.get("torch_npu")
    if loaded is not None:
        return bool(getattr(loaded, "VERL_PATCHES_CPU_EMULATION", False))
    spec = importlib.util.find_spec("torch_npu")
    return spec is not None and is_emulation_path(spec.origin)


def emulation_report() -> dict:
    """For the audit: where the stand-ins live, whether they are active here, every emulated op and
    every MindSpeed feature that cannot run on a CPU host (with the reason)."""
    # deferred: only the audit asks; loaded with the package, `python -m ...npu_emulation.catalog` found its own
    # module already imported (runpy's RuntimeWarning), and every patched process paid for the report's modules
    from verl_patches.npu_emulation.catalog import OPS, limits_table, ops_table
    from verl_patches.npu_emulation.wheel_contract.cpu_proof import EXCEPTIONS, in_effect
    from verl_patches.npu_emulation.wheel_contract.deviations import META_DISAGREEMENTS, MUTATIONS
    from verl_patches.npu_emulation.wheel_contract.summary import op_sources, wheel_summary

    wheel = wheel_summary()
    return {
        "site": str(SITE_DIR),
        "packages": list(EMULATED_PACKAGES),
        "active_in_this_process": is_active(),
        "applies_when": "CPU host without a real torch_npu (never on A3)",
        "emulated_ops": ops_table(),
        "cpu_limits": limits_table(),
        "wheel": {k: v for k, v in wheel.items() if k != "metas"},
        "contract": [op_sources(op, wheel) for entry in OPS for op in entry.wheel_ops],
        "schema_changes": [{"op": op, "reason": m.reason} for op, m in MUTATIONS.items()],
        "meta_disagreements": [
            {"op": op, "outputs": list(d.outputs), "when": f"{d.argument} in {list(d.values)}", "reason": d.reason}
            for op, d in META_DISAGREEMENTS.items()
        ],
        "cpu_proof_exceptions": [
            {"name": e.name, "deviation": e.deviation, "switch": e.env, "owner": e.owner, "in_effect": in_effect(e)}
            for e in EXCEPTIONS
        ],
    }


def emulation_report_text(report: dict | None = None) -> str:
    """The audit's text section for `emulation_report()`."""
    rep = report or emulation_report()
    out = [
        "",
        f"== torch_npu CPU emulation ({rep['applies_when']}; active in this process: "
        f"{'yes' if rep['active_in_this_process'] else 'no'})",
        f"site: {rep['site']}",
    ]
    for op in rep["emulated_ops"]:
        out.append(f"EMULATED  {op['name']:<44} {op['reference']}")
    wheel = rep["wheel"]
    detail = f"; {wheel['detail']}" if wheel["detail"] else ""
    out.append(
        f"held to: {wheel['file']} sha256 {wheel['sha256']} ({wheel['status']}: {wheel['path']}{detail})"
        " -- the source of every schema and Meta function below"
    )
    for row in rep["contract"]:
        tag = "CONTRACT" if row["has_wheel_meta"] else "NO META "
        out.append(f"{tag}  {row['op']:<44} schema: {row['schema']}; Meta: {row['meta']}")
    for change in rep["schema_changes"]:
        out.append(f"SCHEMA CHANGE {change['op']}: {change['reason']}")
    for d in rep["meta_disagreements"]:
        out.append(f"META NOT COMPARED {d['op']} outputs {d['outputs']} when {d['when']}: {d['reason']}")
    for exc in rep["cpu_proof_exceptions"]:
        state = "in effect here" if exc["in_effect"] else "not in effect here"
        out.append(f"DEVIATION FROM A3  {exc['deviation']} (switch {exc['switch']}, {state}; set by {exc['owner']})")
    for lim in rep["cpu_limits"]:
        out.append(f"NOT ON CPU {lim['feature']}: {lim['reason']}")
    return "\n".join(out)
