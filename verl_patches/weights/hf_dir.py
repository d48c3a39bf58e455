"""File names of an HF model directory and of our conversion manifests, and which files are carried over."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from verl_patches.weights.atomic_io import copy_file_atomically, write_text_atomically

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
FP8_CAST_MANIFEST = "fp8_cast_manifest.json"
HF_TO_MCORE_MANIFEST = "conversion_manifest.json"
MCORE_TO_HF_MANIFEST = "export_manifest.json"
_NOT_CARRIED = {CONFIG_FILE, INDEX_FILE, FP8_CAST_MANIFEST, HF_TO_MCORE_MANIFEST, MCORE_TO_HF_MANIFEST}


def carried_over_files(src_dir: Path) -> list[Path]:
    """Top-level files to copy next to converted weights: tokenizer, generation config, remote code, docs.

    Weights, the index and config (rewritten by the converter) and our manifests are not carried.
    """
    return sorted(p for p in Path(src_dir).iterdir()
                  if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".safetensors")
                  and p.name not in _NOT_CARRIED)


def auto_map_modules(cfg: Mapping[str, Any]) -> set[str]:
    """Python files an ``auto_map`` entry points at (``"configuration_deepseek.DeepseekV3Config"`` ->
    ``configuration_deepseek.py``); ``repo--module.Class`` references to other repos are ignored."""
    mods = set()
    for ref in (cfg.get("auto_map") or {}).values():
        for r in (ref if isinstance(ref, list) else [ref]):
            if isinstance(r, str) and "--" not in r and "." in r:
                mods.add(r.rsplit(".", 1)[0] + ".py")
    return mods


def write_model_dir(cfg: Mapping[str, Any], out_dir: Path, carry_from: Path | None = None) -> list[str]:
    """Write ``config.json`` (atomically) and carry tokenizer/remote-code files from ``carry_from``.

    An ``auto_map`` whose module files are not in ``out_dir`` afterwards is dropped: with
    ``trust_remote_code`` it would make transformers fail on a missing file; the native
    ``deepseek_v3`` model type needs no remote code. Returns notes for the user.
    """
    notes = []
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    copied = []
    if carry_from is not None:
        for p in carried_over_files(carry_from):
            copy_file_atomically(p, out_dir / p.name)
            copied.append(p.name)
        if copied:
            notes.append(f"copied {len(copied)} file(s) from {carry_from}: {', '.join(copied)}")
    cfg = dict(cfg)
    missing = sorted(m for m in auto_map_modules(cfg) if not (out_dir / m).is_file())
    if missing:
        cfg.pop("auto_map")
        notes.append(f"dropped auto_map: {', '.join(missing)} not present")
    write_text_atomically(out_dir / CONFIG_FILE, json.dumps(cfg, indent=2) + "\n")
    return notes
