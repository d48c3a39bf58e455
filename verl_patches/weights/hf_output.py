"""The end of a run that writes a BF16 HF model folder (the FP8 cast, the export from Megatron), after its shards:
the folder is complete, and its manifest says so, only once every other file is in place."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.atomic_write import copy_file_atomically, write_json_atomically
from verl_patches.weights.config import CONFIG_FILE
from verl_patches.weights.st_reader import INDEX_FILE


def finish_hf_folder(
    out: Path,
    weight_map: Mapping[str, str],
    total_bytes: int,
    source_config: Mapping[str, Any],
    carried: Iterable[Path],
    manifest: dict[str, Any],
    manifest_file: str,
    *,
    drop_mtp: bool,
) -> None:
    """Write the index, config.json (BF16, without quantization_config; with no MTP layer when `drop_mtp`) and
    the files carried over from the source (tokenizer...), then the manifest marked complete."""
    write_json_atomically(out / INDEX_FILE, {"metadata": {"total_size": total_bytes}, "weight_map": dict(weight_map)})
    config = {k: v for k, v in source_config.items() if k != "quantization_config"}
    config["torch_dtype"] = "bfloat16"
    if drop_mtp:
        config["num_nextn_predict_layers"] = 0
    write_json_atomically(out / CONFIG_FILE, config)
    for p in carried:
        copy_file_atomically(p, out / p.name)
    manifest["complete"] = True
    write_json_atomically(out / manifest_file, manifest)
