"""HF BF16 DeepSeek-V3 -> legacy Megatron checkpoint for MindSpeed-LLM (vendor item J2), one rank at a time.

Output, as MindSpeed-LLM loads it: ``SAVE/latest_checkpointed_iteration.txt`` ("1") and
``SAVE/iter_0000001/<rank dir>/model_optim_rng.pt`` = ``{"model": state_dict, "checkpoint_version": 3.0,
"iteration": 1}``; names and tensor layouts in ``names`` / ``tensor_layout``.

Memory: a rank's state dict is built from row/column slices read lazily from the memory-mapped shards
(only the bytes the rank needs), saved, and dropped before the next rank, so peak memory is about one
rank's share (for 671B at TP4/PP8/EP8 with TP-extend-EP: ~6 GB) instead of the whole model. Resumable:
``conversion_manifest.json`` records size and sha256 of every finished rank file, a re-run skips ranks
that still match, and the iteration tracker is written last, so a half-converted directory never looks
loadable. The manifest also records the layout and the HF config, which the reverse conversion reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from verl_patches.base.atomic_write import (
    atomic_path,
    remove_stale_temps,
    write_json_atomically,
    write_text_atomically,
)
from verl_patches.weights import tensor_layout as tl
from verl_patches.weights.config import load_config
from verl_patches.weights.dequant import first_non_finite
from verl_patches.weights.errors import CheckpointError, MissingTensorError
from verl_patches.weights.file_digest import file_sha256
from verl_patches.weights.hf_dir import HF_TO_MCORE_MANIFEST
from verl_patches.weights.hf_schema import hf_tensor_specs, is_moe_layer
from verl_patches.weights.layout import (
    ParallelLayout,
    Rank,
    all_ranks,
    expert_slice_index,
    expert_tp,
    local_experts,
    rank_dir_name,
    stage_layers,
    validate_layout,
)
from verl_patches.weights.manifest_file import is_rank_dir_name, read_conversion_manifest
from verl_patches.weights.names import GLOBAL_POST, GLOBAL_PRE, HF_LAYER, MCORE_LAYER, NameRule, layer_rules
from verl_patches.weights.parallel import run_tasks
from verl_patches.weights.resume import plan_output, remove_listed
from verl_patches.weights.st_reader import DEFAULT_REMAP_BYTES, CheckpointIndex, LazyCheckpoint, read_header
from verl_patches.weights.tensor_layout import MetaSource, TensorSource
from verl_patches.weights.write_report import WriteReport

TRACKER_FILE = "latest_checkpointed_iteration.txt"
ITERATION = 1
CKPT_FILE = "model_optim_rng.pt"
MANIFEST_FILE = HF_TO_MCORE_MANIFEST


def iteration_dir(iteration: int | str) -> str:
    return "release" if iteration == "release" else f"iter_{int(iteration):07d}"


def rank_file(save_dir: Path, layout: ParallelLayout, rank: Rank, iteration: int | str = ITERATION) -> Path:
    return save_dir / iteration_dir(iteration) / rank_dir_name(layout, rank) / CKPT_FILE


def _build(src: TensorSource, rule: NameRule, hf_names: list[str], parts: int, idx: int) -> torch.Tensor:
    if rule.kind == "replicated":
        return tl.build_replicated(src, hf_names)
    if rule.kind == "concat_rows":
        return tl.build_concat_rows(src, hf_names)
    if rule.kind == "tp_rows":
        return tl.build_tp_rows(src, hf_names, parts, idx)
    if rule.kind == "tp_cols":
        return tl.build_tp_cols(src, hf_names, parts, idx)
    if rule.kind == "gate_up":
        return tl.build_gate_up(src, hf_names, parts, idx)
    raise ValueError(f"unknown layout kind {rule.kind!r}")


def owned(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a tensor owning exactly its bytes.

    Slices read from safetensors are views of the memory-mapped whole tensor, and ``torch.save`` writes a
    view's entire storage: without this a TP shard would be saved at full size (and keep the mapping).
    """
    if t.device.type == "meta":
        return t
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def build_rank_state_dict(
    src: TensorSource, cfg: Mapping[str, Any], layout: ParallelLayout, rank: Rank
) -> dict[str, torch.Tensor]:
    """The ``model`` state dict of one checkpoint rank, in Megatron's parameter order."""
    sd: dict[str, torch.Tensor] = {}
    n_layers = cfg["num_hidden_layers"]
    stages = stage_layers(layout, n_layers)
    tp, t = layout.tp, rank.tp
    if rank.pp == 0:
        for rule in GLOBAL_PRE:
            sd[rule.mcore] = owned(_build(src, rule, list(rule.hf), tp, t))
    experts = local_experts(layout, cfg["n_routed_experts"], rank)
    e_parts, e_idx = expert_tp(layout), expert_slice_index(layout, rank)
    for local, layer in enumerate(stages[rank.pp]):
        mp, hp = MCORE_LAYER.format(layer=local), HF_LAYER.format(layer=layer)
        for rule in layer_rules(is_moe_layer(cfg, layer), layout.moe_grouped_gemm):
            if rule.kind == "grouped_w1":
                pairs = [(hp + rule.hf[0].format(expert=e), hp + rule.hf[1].format(expert=e)) for e in experts]
                sd[mp + rule.mcore] = owned(tl.build_grouped_w1(src, pairs, e_parts, e_idx))
            elif rule.kind == "grouped_w2":
                downs = [hp + rule.hf[0].format(expert=e) for e in experts]
                sd[mp + rule.mcore] = owned(tl.build_grouped_w2(src, downs, e_parts, e_idx))
            elif "{expert}" in rule.mcore:
                for j, e in enumerate(experts):
                    names = [hp + h.format(expert=e) for h in rule.hf]
                    sd[mp + rule.mcore.format(expert=j)] = owned(_build(src, rule, names, e_parts, e_idx))
            else:
                sd[mp + rule.mcore] = owned(_build(src, rule, [hp + h for h in rule.hf], tp, t))
    if rank.pp == layout.pp - 1:
        for rule in GLOBAL_POST:
            sd[rule.mcore] = owned(_build(src, rule, list(rule.hf), tp, t))
    return sd


def meta_source(cfg: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16) -> MetaSource:
    """A shape-only stand-in for the HF checkpoint that ``cfg`` describes."""
    specs = hf_tensor_specs(cfg, dtype)
    return MetaSource({s.name: s.shape for s in specs}, {s.name: s.dtype for s in specs})


def plan_rank_shapes(
    cfg: Mapping[str, Any], layout: ParallelLayout, rank: Rank, meta: MetaSource | None = None
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``{key: (shape, dtype)}`` of a rank, computed from the config alone (meta tensors)."""
    meta = meta or meta_source(cfg)
    return {k: (tuple(v.shape), v.dtype) for k, v in build_rank_state_dict(meta, cfg, layout, rank).items()}


def rank_sizes(cfg: Mapping[str, Any], layout: ParallelLayout) -> dict[Rank, int]:
    """Bytes of every rank's state dict."""
    meta = meta_source(cfg)
    return {
        r: sum(
            torch.Size(s).numel() * torch.empty((), dtype=d).element_size()
            for s, d in plan_rank_shapes(cfg, layout, r, meta).values()
        )
        for r in all_ranks(layout)
    }


def unconverted_hint(name: str, cfg: Mapping[str, Any]) -> str:
    parts = name.split(".")
    if name.endswith("_scale_inv"):
        return "an FP8 scale: convert the checkpoint with fp8_cast_bf16.py first"
    if (
        len(parts) > 2
        and parts[:2] == ["model", "layers"]
        and parts[2].isascii()
        and parts[2].isdigit()
        and int(parts[2]) >= cfg["num_hidden_layers"]
    ):
        return "a layer beyond num_hidden_layers (the MTP layer): convert with fp8_cast_bf16.py --drop-mtp"
    return "the converter has no Megatron place for it and would drop it"


def check_source(index: CheckpointIndex, cfg: Mapping[str, Any]) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Every tensor the model needs is present with the shape config.json implies, and every tensor of the
    checkpoint is one of them (before any work): a tensor outside the DeepSeek-V3 schema (an ``o_proj.bias``)
    would be silently dropped, so it is refused by name."""
    headers = {f: read_header(index.root / f) for f in index.files()}
    found: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for name, fname in index.weight_map.items():
        if name in headers[fname]:
            found[name] = headers[fname][name]
    for spec in hf_tensor_specs(cfg):
        if spec.name not in index.weight_map:
            raise MissingTensorError(
                f"{index.root}: tensor {spec.name!r} required by config.json is not in the checkpoint"
            )
        if spec.name not in found:
            raise MissingTensorError(
                f"{index.root / index.weight_map[spec.name]}: tensor {spec.name!r} listed in the index "
                f"is not in this shard"
            )
        dtype, shape = found[spec.name]
        if tuple(shape) != spec.shape:
            raise CheckpointError(
                f"{index.root / index.weight_map[spec.name]}: tensor {spec.name!r} has shape "
                f"{tuple(shape)}, config.json implies {spec.shape}"
            )
        if dtype in (torch.float8_e4m3fn,):
            raise CheckpointError(
                f"{index.root / index.weight_map[spec.name]}: tensor {spec.name!r} is FP8; "
                f"convert the checkpoint with fp8_cast_bf16.py first"
            )
        if not dtype.is_floating_point or dtype.itemsize < 2:
            raise CheckpointError(
                f"{index.root / index.weight_map[spec.name]}: tensor {spec.name!r} is {dtype}; "
                f"a DeepSeek-V3 weight is bfloat16, float16 or float32"
            )
    schema = {s.name for s in hf_tensor_specs(cfg)}
    unknown = sorted(n for n in index.weight_map if n not in schema)
    if unknown:
        first = unknown[0]
        raise CheckpointError(
            f"{index.root / index.weight_map[first]}: tensor {first!r} is not part of the "
            f"DeepSeek-V3 model config.json describes ({unconverted_hint(first, cfg)}); "
            f"{len(unknown)} such tensor(s)"
        )
    return found


def _manifest_key(index: CheckpointIndex, cfg: Mapping[str, Any], layout: ParallelLayout) -> dict[str, Any]:
    return {
        "tool": "verl_patches.weights.hf_to_mcore",
        "version": 1,
        "source": index.fingerprint(),
        "layout": layout.to_json(),
        "iteration": ITERATION,
        "hf_config": dict(cfg),
    }


def load_manifest(save_dir: Path) -> dict[str, Any] | None:
    """The folder's ``conversion_manifest.json`` as a dict, after the strict parse (`manifest_file`: tool,
    layout, config, rank names and digests checked; ManifestError naming the key otherwise), or None."""
    man = read_conversion_manifest(save_dir, MANIFEST_FILE)
    return None if man is None else man.raw


def _rank_file_of(name: str) -> str:
    return f"{iteration_dir(ITERATION)}/{name}/{CKPT_FILE}"


def _convert_rank(job: tuple[str, str, dict, dict, Rank, int]) -> dict[str, Any]:
    """Worker: build, save (temp + rename) and hash one rank."""
    load_dir, save_dir, cfg, layout_json, rank, remap_bytes = job
    layout = ParallelLayout.from_json(layout_json)
    index = CheckpointIndex.load(load_dir)
    with LazyCheckpoint(index, remap_bytes=remap_bytes) as src:
        sd = build_rank_state_dict(src, cfg, layout, rank)
    for key, t in sd.items():  # a NaN or inf weight is never copied bit for bit into a rank file
        bad = first_non_finite(t)
        if bad is not None:
            raise CheckpointError(
                f"{load_dir}: the weights for {key!r} (rank {rank_dir_name(layout, rank)}) hold a "
                f"non-finite value ({bad[1]}) at {bad[0]}; refused"
            )
    with atomic_path(rank_file(Path(save_dir), layout, rank)) as tmp:
        torch.save({"model": sd, "checkpoint_version": 3.0, "iteration": ITERATION}, tmp)
        del sd
        size, sha = tmp.stat().st_size, file_sha256(tmp)
    return {"rank": rank_dir_name(layout, rank), "size": size, "sha256": sha}


def convert_hf_to_mcore(
    load_dir: str | Path,
    save_dir: str | Path,
    layout: ParallelLayout,
    *,
    num_layers: int | None = None,
    first_k_dense_replace: int | None = None,
    overwrite: bool = False,
    workers: int = 1,
    progress: bool = True,
    remap_bytes: int = DEFAULT_REMAP_BYTES,
) -> WriteReport:
    """Convert; every flag and the source are checked before the first rank is written."""
    load, save = Path(load_dir), Path(save_dir)
    cfg = load_config(load)
    validate_layout(layout, cfg, num_layers, first_k_dense_replace)
    index = CheckpointIndex.load(load)
    check_source(index, cfg)

    key = _manifest_key(index, cfg, layout)
    plan = plan_output(save, key, overwrite, "ranks", MANIFEST_FILE, is_rank_dir_name, "rank folder")
    manifest = plan.manifest
    save.mkdir(parents=True, exist_ok=True)
    (save / TRACKER_FILE).unlink(missing_ok=True)  # not loadable until every rank is in place
    # only the rank files our earlier manifest lists: those of an earlier, different layout would be loaded
    # by nobody; nothing else in the folder is ours to delete
    remove_listed(
        save,
        plan.previous,
        "ranks",
        keep={rank_dir_name(layout, r) for r in all_ranks(layout)},
        item_path=_rank_file_of,
        keep_files={TRACKER_FILE},
    )
    manifest["complete"] = False
    manifest["files"] = [TRACKER_FILE]
    write_json_atomically(save / MANIFEST_FILE, manifest)
    report = WriteReport("rank")
    todo: list[Rank] = []
    for rank in all_ranks(layout):
        report.total += 1
        name = rank_dir_name(layout, rank)
        path = rank_file(save, layout, rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temps(path.parent)
        entry = manifest["ranks"].get(name)
        if entry and path.is_file() and path.stat().st_size == entry["size"] and file_sha256(path) == entry["sha256"]:
            report.skipped.append(name)
        else:
            manifest["ranks"].pop(name, None)
            todo.append(rank)

    def record(job: tuple, result: dict[str, Any]) -> None:
        manifest["ranks"][result["rank"]] = {"size": result["size"], "sha256": result["sha256"]}
        write_json_atomically(save / MANIFEST_FILE, manifest)
        report.written.append(result["rank"])

    jobs = [(str(load), str(save), cfg, layout.to_json(), r, remap_bytes) for r in todo]
    sizes = rank_sizes(cfg, layout)
    run_tasks(
        _convert_rank,
        jobs,
        [sizes[r] for r in todo],
        workers=workers,
        on_result=record,
        desc="hf->mcore",
        progress=progress,
    )

    report.out_bytes = sum(e["size"] for e in manifest["ranks"].values())
    manifest["complete"] = True
    write_json_atomically(save / MANIFEST_FILE, manifest)
    write_text_atomically(save / TRACKER_FILE, str(ITERATION))
    return report
