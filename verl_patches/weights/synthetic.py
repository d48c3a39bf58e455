"""Synthetic DeepSeek-V3-shaped HF checkpoints (random weights, BF16 or block-FP8), written shard by shard.

For tests, benchmarks and for trying the weight pipeline without downloading 650 GB. Tensor values are
a deterministic function of ``seed`` and the tensor name; memory use is one tensor at a time.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from verl_patches.weights.config import CONFIG_FILE
from verl_patches.weights.dequant import DEFAULT_BLOCK, scale_grid_shape
from verl_patches.weights.fp8_cast import SCALE_SUFFIX
from verl_patches.weights.hf_schema import hf_tensor_specs, is_fp8_quantized
from verl_patches.weights.st_reader import INDEX_FILE
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file

FP8_MAX = 448.0


def _generator(seed: int, name: str) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & ((1 << 63) - 1))
    return g


def random_tensor(spec: TensorSpec, seed: int) -> torch.Tensor:
    g = _generator(seed, spec.name)
    return (torch.randn(spec.shape, generator=g) * 0.05).to(spec.dtype)


def quantize_fp8_blockwise(
    w: torch.Tensor, block: tuple[int, int] = DEFAULT_BLOCK
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(fp8 weight, float32 scale_inv)`` with each block's amax mapped to the FP8 maximum."""
    m, n = w.shape
    bm, bn = block
    gm, gn = scale_grid_shape((m, n), block)
    padded = F.pad(w.float(), (0, gn * bn - n, 0, gm * bm - m))
    # clamped as DeepGEMM's per_block_cast_to_fp8 clamps it: an all-zero block keeps a scale in SCALE_INV_RANGE
    amax = padded.view(gm, bm, gn, bn).abs().amax(dim=(1, 3)).clamp_min(1e-4)
    scale = amax / FP8_MAX
    full = scale.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[:m, :n]
    return (w.float() / full).to(torch.float8_e4m3fn), scale


def write_synthetic_checkpoint(
    out_dir: str | Path,
    cfg: Mapping[str, Any],
    *,
    fp8: bool = False,
    block: tuple[int, int] = DEFAULT_BLOCK,
    num_shards: int = 3,
    seed: int = 0,
    num_mtp_layers: int = 0,
    scales_in_next_shard: bool = False,
    tokenizer_files: bool = True,
) -> dict[str, str]:
    """Write a checkpoint for ``cfg``; return its weight map.

    With ``fp8``, the quantisable linear weights are stored as float8_e4m3fn plus ``*_scale_inv`` and the
    config gets DeepSeek's ``quantization_config``. ``scales_in_next_shard`` puts every other scale into
    the following shard (the official checkpoint has scales in a different shard than their weight).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    specs = hf_tensor_specs(cfg, num_mtp_layers=num_mtp_layers)
    total = sum(s.nbytes for s in specs)
    groups: list[list[TensorSpec]] = [[] for _ in range(num_shards)]
    acc = 0
    for s in specs:  # contiguous ranges of about equal bytes, so layers span shard boundaries
        groups[min(num_shards - 1, acc * num_shards // max(1, total))].append(s)
        acc += s.nbytes

    files = [f"model-{i + 1:05d}-of-{num_shards:05d}.safetensors" for i in range(num_shards)]
    entries: list[list[tuple[TensorSpec, Any]]] = [[] for _ in range(num_shards)]
    flip = False
    for i, group in enumerate(groups):
        for s in group:
            if fp8 and is_fp8_quantized(s.name):
                gm_gn = scale_grid_shape(s.shape, block)
                entries[i].append((TensorSpec(s.name, torch.float8_e4m3fn, s.shape), ("w", s)))
                j = min(i + 1, num_shards - 1) if (scales_in_next_shard and flip) else i
                flip = not flip
                entries[j].append((TensorSpec(s.name + SCALE_SUFFIX, torch.float32, gm_gn), ("s", s)))
            else:
                entries[i].append((s, ("v", s)))

    last: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # the most recent (fp8, scale) pair

    def produce_for(kinds: dict[str, tuple[str, TensorSpec]]):
        def produce(spec: TensorSpec) -> torch.Tensor:
            kind, src = kinds[spec.name]
            if kind == "v":
                return random_tensor(src, seed)
            if src.name not in last:  # deterministic, so a scale in another shard is simply recomputed
                last.clear()
                last[src.name] = quantize_fp8_blockwise(random_tensor(src, seed), block)
            w, sc = last[src.name]
            return w if kind == "w" else sc

        return produce

    weight_map: dict[str, str] = {}
    for fname, ents in zip(files, entries):
        specs_i = [e[0] for e in ents]
        kinds = {e[0].name: e[1] for e in ents}
        write_safetensors_file(out / fname, specs_i, produce_for(kinds), {"format": "pt"})
        for s in specs_i:
            weight_map[s.name] = fname
    index = {"metadata": {"total_size": sum(e[0].nbytes for ents in entries for e in ents)}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
    c = dict(cfg)
    c["num_nextn_predict_layers"] = num_mtp_layers
    if fp8:
        c["quantization_config"] = {
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "quant_method": "fp8",
            "weight_block_size": list(block),
        }
    (out / CONFIG_FILE).write_text(json.dumps(c, indent=2))
    if tokenizer_files:
        (out / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 4096, "synthetic": True}))
        (out / "generation_config.json").write_text(
            json.dumps({"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"]})
        )
    return weight_map
