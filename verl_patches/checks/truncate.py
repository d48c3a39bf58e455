"""A truncated copy of a DeepSeek-V3 checkpoint: the first K decoder layers and the first M routed experts.

Every engine of `check_logprobs` reads the same truncated HF folder (the Megatron engine through a conversion
of it), so a slice of the 671B checkpoint is checked on one host. The plan (`truncated_config`,
`plan_truncation`) is pure; the writers stream one tensor at a time like the converter (memory-mapped shards
in, `write_safetensors_file` out, temp file + rename per shard, the index and config written last), so the
resident memory stays near one output shard's largest tensor.

What changes besides dropping tensors: the router (`mlp.gate.weight`, `mlp.gate.e_score_correction_bias`)
keeps its first M rows, config.json says `num_hidden_layers=K`, `n_routed_experts=M`, no MTP layer, and
`first_k_dense_replace` is capped at K.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_patches.base.atomic_write import atomic_path, remove_stale_temps, write_json_atomically
from verl_patches.weights.config import load_config, validate_config
from verl_patches.weights.errors import ConfigError
from verl_patches.weights.hf_dir import write_model_dir
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.st_reader import INDEX_FILE, CheckpointIndex, LazyCheckpoint
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file

DEFAULT_SHARD_BYTES = 2 * 1024**3
ROUTER_SUFFIXES = (".mlp.gate.weight", ".mlp.gate.e_score_correction_bias")


@dataclass(frozen=True)
class TensorPick:
    """One output tensor: read ``name`` from the source, keeping only its first ``rows`` rows if set."""

    name: str
    rows: int | None = None


def truncated_config(cfg: Mapping[str, Any], layers: int | None, experts: int | None) -> dict[str, Any]:
    """config.json of the truncated model; an impossible request is one error naming the flag."""
    out = dict(cfg)
    n, e = cfg["num_hidden_layers"], cfg["n_routed_experts"]
    if layers is not None:
        if not 1 <= layers <= n:
            raise ConfigError(f"--layers {layers}: the model has {n} decoder layers (num_hidden_layers)")
        out["num_hidden_layers"] = layers
        out["first_k_dense_replace"] = min(cfg["first_k_dense_replace"], layers)
    if experts is not None:
        groups, topk_group, k = cfg.get("n_group") or 1, cfg.get("topk_group") or 1, cfg["num_experts_per_tok"]
        if not 1 <= experts <= e:
            raise ConfigError(f"--experts {experts}: the model has {e} routed experts (n_routed_experts)")
        if experts % groups:
            raise ConfigError(
                f"--experts {experts} is not divisible by n_group={groups} (the router picks experts "
                f"within groups); use a multiple of {groups}"
            )
        per_group = experts // groups
        # the noaux_tc router scores a group by the sum of its top-2 experts and picks num_experts_per_tok
        # experts from the topk_group best groups
        if per_group < 2 or per_group * topk_group < k:
            need = groups * max(2, -(-k // topk_group))
            raise ConfigError(
                f"--experts {experts}: with n_group={groups}, topk_group={topk_group} and "
                f"num_experts_per_tok={k} the router needs at least {need} experts"
            )
        out["n_routed_experts"] = experts
    out["num_nextn_predict_layers"] = 0
    out.pop("quantization_config", None)
    validate_config(out, where="truncated config")
    return out


def plan_truncation(
    cfg: Mapping[str, Any], layers: int | None, experts: int | None
) -> tuple[dict[str, Any], list[TensorPick]]:
    """The truncated config and, in the checkpoint's order, which source tensor each output tensor comes from."""
    out_cfg = truncated_config(cfg, layers, experts)
    keep = out_cfg["n_routed_experts"]
    picks = []
    for spec in hf_tensor_specs(out_cfg):
        sliced = keep < cfg["n_routed_experts"] and spec.name.endswith(ROUTER_SUFFIXES)
        picks.append(TensorPick(spec.name, keep if sliced else None))
    return out_cfg, picks


def plan_shards(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Order-preserving groups of at most ``max_bytes`` (a bigger tensor stands alone)."""
    shards: list[list[TensorSpec]] = []
    size = 0
    for s in specs:
        if not shards or (shards[-1] and size + s.nbytes > max_bytes):
            shards.append([])
            size = 0
        shards[-1].append(s)
        size += s.nbytes
    return shards


def write_hf_folder(
    out_dir: Path,
    cfg: Mapping[str, Any],
    picks: list[TensorPick],
    info: Callable[[str], tuple[torch.dtype, tuple[int, ...]]],
    read: Callable[[TensorPick], torch.Tensor],
    *,
    carry_from: Path | None,
    after_shard: Callable[[], None] = lambda: None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Write ``picks`` (read one at a time) as an HF folder: shards, then index, then config and tokenizer."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir)
    specs = []
    for p in picks:
        dtype, shape = info(p.name)
        shape = (p.rows, *shape[1:]) if p.rows is not None else tuple(shape)
        specs.append(TensorSpec(p.name, dtype, shape))
    by_name = {p.name: p for p in picks}
    shards = plan_shards(specs, max_shard_bytes)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for fname, group in zip(files, shards):
        try:
            with atomic_path(out_dir / fname) as tmp:
                write_safetensors_file(tmp, group, lambda s: read(by_name[s.name]).contiguous(), {"format": "pt"})
        finally:
            after_shard()
    total = sum(s.nbytes for s in specs)
    write_json_atomically(
        out_dir / INDEX_FILE,
        {"metadata": {"total_size": total}, "weight_map": {s.name: f for f, g in zip(files, shards) for s in g}},
    )
    write_model_dir(cfg, out_dir, carry_from=carry_from)
    return out_dir


def _rows(t: torch.Tensor, rows: int | None) -> torch.Tensor:
    return t if rows is None else t[:rows]


def truncate_hf(
    src_dir: str | Path,
    out_dir: str | Path,
    layers: int | None,
    experts: int | None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """Truncated copy of an HF BF16/FP32 folder (tokenizer files carried over)."""
    # lazy: that module loads tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import check_source

    src = Path(src_dir)
    cfg = load_config(src)
    out_cfg, picks = plan_truncation(cfg, layers, experts)
    index = CheckpointIndex.load(src)
    check_source(index, cfg)  # every needed tensor present with its shape, no FP8, before any work
    with LazyCheckpoint(index) as ckpt:
        return write_hf_folder(
            Path(out_dir),
            out_cfg,
            picks,
            ckpt.info,
            lambda p: _rows(ckpt.get(p.name), p.rows).clone(),
            carry_from=src,
            max_shard_bytes=max_shard_bytes,
        )


def truncate_mcore_to_hf(
    mcore_dir: str | Path,
    out_dir: str | Path,
    layers: int | None,
    experts: int | None,
    tokenizer_dir: str | Path | None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> Path:
    """The truncated model read out of a Megatron legacy checkpoint (layout and config from its manifest),
    tensor by tensor through the reverse converter, as an HF folder (to be converted to the check's layout)."""
    # lazy: that module loads tqdm; importing this one must not
    from verl_patches.weights.mcore_to_hf import (
        RankStore,
        check_rank_files,
        hf_tensor_from_ranks,
        read_tracker,
        resolve_layout_and_config,
    )

    load = Path(mcore_dir)
    layout, cfg = resolve_layout_and_config(load, None, None)
    store = RankStore(load, layout, read_tracker(load))
    check_rank_files(store, cfg)
    out_cfg, picks = plan_truncation(cfg, layers, experts)

    def read(p: TensorPick) -> torch.Tensor:
        return _rows(hf_tensor_from_ranks(p.name, cfg, layout, store.fetch), p.rows).clone()

    def info(name: str) -> tuple[torch.dtype, tuple[int, ...]]:
        t = hf_tensor_from_ranks(name, cfg, layout, lambda r, k: torch.empty_like(store.fetch(r, k), device="meta"))
        return t.dtype, tuple(t.shape)

    return write_hf_folder(
        Path(out_dir),
        out_cfg,
        picks,
        info,
        read,
        carry_from=Path(tokenizer_dir) if tokenizer_dir else None,
        after_shard=store.clear,
        max_shard_bytes=max_shard_bytes,
    )
