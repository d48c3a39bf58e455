"""File names of an HF model directory and of our conversion manifests, and which files are carried over."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import copy_file_atomically, write_text_atomically
from verl_patches.weights.errors import CheckpointError

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
FP8_CAST_MANIFEST = "fp8_cast_manifest.json"
HF_TO_MCORE_MANIFEST = "conversion_manifest.json"
MCORE_TO_HF_MANIFEST = "export_manifest.json"
_NOT_CARRIED = {CONFIG_FILE, INDEX_FILE, FP8_CAST_MANIFEST, HF_TO_MCORE_MANIFEST, MCORE_TO_HF_MANIFEST}


def _link_allowed(src_dir: Path, link: Path) -> bool:
    """A symlink is followed only inside the model folder, or into the blob store of a Hugging Face hub
    cache snapshot (`models--X/snapshots/REV/f -> ../../blobs/H`, how `huggingface-cli download` lays
    files out). Anything else (e.g. `tokenizer.json -> ~/.ssh/id_rsa`) would be copied with its target's
    contents into an output folder that may be shared."""
    target = link.resolve()
    base = src_dir.resolve()
    if target.is_relative_to(base):
        return True
    if base.parent.name == "snapshots" and base.parent.parent.name.startswith("models--"):
        return target.is_relative_to(base.parent.parent / "blobs")
    return False


def carried_over_files(src_dir: Path) -> list[Path]:
    """Top-level files to copy next to converted weights: tokenizer, generation config, remote code, docs.

    Weights, the index and config (rewritten by the converter) and our manifests are not carried; only
    regular files are, and a symlink only where `_link_allowed` says so (else an error names it).
    """
    src_dir = Path(src_dir)
    out = []
    for p in sorted(src_dir.iterdir()):
        if p.name.startswith(".") or p.name.endswith(".safetensors") or p.name in _NOT_CARRIED:
            continue
        if p.is_symlink() and not _link_allowed(src_dir, p):
            raise CheckpointError(
                f"{p}: a symlink to {os.readlink(p)!r}, outside the model folder; copy the file "
                f"itself into {src_dir} or remove the link"
            )
        if p.is_file():
            out.append(p)
    return out


def auto_map_modules(cfg: Mapping[str, Any]) -> set[str]:
    """Python files an ``auto_map`` entry points at (``"configuration_deepseek.DeepseekV3Config"`` ->
    ``configuration_deepseek.py``); ``repo--module.Class`` references to other repos are ignored."""
    mods = set()
    for ref in (cfg.get("auto_map") or {}).values():
        for r in ref if isinstance(ref, list) else [ref]:
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
