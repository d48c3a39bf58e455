"""Streaming, resumable FP8 -> BF16 conversion of a DeepSeek-V3 Hugging Face checkpoint (vendor item J1).

Planning (pure, from the index and the shard headers): every ``float8_e4m3fn`` tensor ``W`` must have
``W_scale_inv`` (in any shard) of the block-grid shape; every scale must belong to a weight; the output
shard keeps the input shard's file name and holds its tensors minus the scales (optionally minus the
MTP layers). Execution: each output shard is streamed tensor by tensor into a temporary file, hashed on
the way and renamed into place; a manifest records size and sha256 of every finished shard, so a re-run
skips shards whose file still matches. The index, the config (without ``quantization_config``) and the
tokenizer/remote-code files are written last, so a half-finished output is never mistaken for a
complete checkpoint. Peak memory per worker is about one tensor (the embedding, 1.8 GB for 671B).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_patches.base.atomic_write import (
    atomic_path,
    remove_stale_temps,
    write_json_atomically,
)
from verl_patches.weights.config import CONFIG_FILE, read_config_json
from verl_patches.weights.dequant import (
    DEFAULT_BLOCK,
    FP8_DTYPES,
    Workspace,
    dequantize_fp8_blockwise,
    first_non_finite,
    scale_grid_shape,
)
from verl_patches.weights.errors import CheckpointError, ConfigError, MissingTensorError, ResumeError
from verl_patches.weights.file_digest import file_sha256
from verl_patches.weights.hf_dir import FP8_CAST_MANIFEST, carried_over_files
from verl_patches.weights.hf_output import finish_hf_folder
from verl_patches.weights.manifest_file import is_shard_file_name
from verl_patches.weights.parallel import run_tasks
from verl_patches.weights.resume import FILES_KEY, plan_output, remove_listed
from verl_patches.weights.st_reader import INDEX_FILE, CheckpointIndex, LazyCheckpoint, read_header
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file
from verl_patches.weights.write_report import WriteReport

SCALE_SUFFIX = "_scale_inv"
MANIFEST_FILE = FP8_CAST_MANIFEST
# other 8-bit float formats: copied as they are they would reach training as FP8, so they are refused by name
_OTHER_FP8 = tuple(
    getattr(torch, n) for n in ("float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz") if hasattr(torch, n)
)

_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class CastItem:
    """One output tensor: its source, output dtype/shape, and where its scale lives (FP8 only)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    scale_name: str | None = None
    scale_file: str | None = None


@dataclass(frozen=True)
class ShardTask:
    file: str
    items: tuple[CastItem, ...]
    in_bytes: int


@dataclass
class CastReport(WriteReport):
    unit: str = "shard"
    tensors_dequantized: int = 0
    tensors_dropped: int = 0


def block_size_from_config(cfg: Mapping[str, Any], where: str = CONFIG_FILE) -> tuple[int, int]:
    q = cfg.get("quantization_config")
    if not q:
        return DEFAULT_BLOCK
    blk = q.get("weight_block_size", list(DEFAULT_BLOCK))
    if (
        not isinstance(blk, list)
        or len(blk) != 2
        or not all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in blk)
    ):
        raise ConfigError(
            f"{where}: key 'quantization_config.weight_block_size' must be two positive integers, got {blk!r}"
        )
    return (blk[0], blk[1])


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    return TensorSpec("", dtype, tuple(shape)).nbytes


def plan_fp8_cast(
    index: CheckpointIndex,
    headers: Mapping[str, Mapping[str, tuple[torch.dtype, tuple[int, ...]]]],
    block: tuple[int, int] = DEFAULT_BLOCK,
    keep_layers_below: int | None = None,
) -> list[ShardTask]:
    """Per input shard, the tensors to write and the scale of each FP8 one. Raises on any inconsistency.

    ``keep_layers_below`` drops ``model.layers.N.*`` with ``N >=`` it (the MTP layer of DeepSeek-V3).
    """
    info: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {}
    for hdr in headers.values():
        for name, dt_shape in hdr.items():
            info[name] = dt_shape
    for name, fname in index.weight_map.items():
        if name not in headers.get(fname, {}):
            raise MissingTensorError(f"{index.root / fname}: tensor {name!r} listed in the index is not in this shard")

    scales_used: set[str] = set()
    tasks = []
    for fname in index.files():
        items, in_bytes = [], 0
        for name in index.tensors_in(fname):
            dtype, shape = info[name]
            in_bytes += _nbytes(dtype, shape)
            if name.endswith(SCALE_SUFFIX):
                continue
            m = _LAYER_RE.match(name)
            if keep_layers_below is not None and m and int(m.group(1)) >= keep_layers_below:
                continue
            if dtype in _OTHER_FP8:
                raise CheckpointError(
                    f"{index.root / fname}: tensor {name!r} is {dtype}; this tool converts "
                    f"DeepSeek-V3's block-quantised float8_e4m3fn weights only"
                )
            if dtype in FP8_DTYPES:
                sname = name + SCALE_SUFFIX
                if sname not in index.weight_map:
                    raise MissingTensorError(
                        f"{index.root / fname}: FP8 tensor {name!r} has no {sname!r} in the checkpoint"
                    )
                if len(shape) != 2:
                    raise CheckpointError(
                        f"{index.root / fname}: FP8 tensor {name!r} has shape {shape}; "
                        "only 2-D weights are block-quantised"
                    )
                if not info[sname][0].is_floating_point or info[sname][0] in FP8_DTYPES + _OTHER_FP8:
                    raise CheckpointError(
                        f"{index.root / index.weight_map[sname]}: scale {sname!r} is "
                        f"{info[sname][0]}; expected a float32 (or float16/bfloat16) scale"
                    )
                want = scale_grid_shape(shape, block)
                if tuple(info[sname][1]) != want:
                    raise CheckpointError(
                        f"{index.root / index.weight_map[sname]}: scale {sname!r} has shape "
                        f"{info[sname][1]}, expected {want} for {name!r} {shape} with block {block}"
                    )
                scales_used.add(sname)
                items.append(CastItem(name, torch.bfloat16, tuple(shape), sname, index.weight_map[sname]))
            else:
                items.append(CastItem(name, dtype, tuple(shape)))
        tasks.append(ShardTask(fname, tuple(items), in_bytes))

    for name, fname in index.weight_map.items():
        if name.endswith(SCALE_SUFFIX) and name not in scales_used:
            weight = name[: -len(SCALE_SUFFIX)]
            m = _LAYER_RE.match(weight)
            dropped = keep_layers_below is not None and m and int(m.group(1)) >= keep_layers_below
            if weight not in index.weight_map and not dropped:
                raise CheckpointError(f"{index.root / fname}: scale {name!r} has no weight {weight!r}")
            if weight in info and info[weight][0] not in FP8_DTYPES and not dropped:
                raise CheckpointError(f"{index.root / fname}: scale {name!r} belongs to {weight!r}, which is not FP8")
    return tasks


def cast_shard(job: tuple[str, str, ShardTask, tuple[int, int]]) -> dict[str, Any]:
    """Worker: write one output shard (temp file, then rename); return its size and sha256."""
    in_root, out_root, task, block = job
    needed = {it.name: task.file for it in task.items}
    needed.update({it.scale_name: it.scale_file for it in task.items if it.scale_name})
    src = LazyCheckpoint(CheckpointIndex(Path(in_root), needed, has_index_file=False), max_open=2)
    specs = [TensorSpec(it.name, it.dtype, it.shape) for it in task.items]
    by_name = {it.name: it for it in task.items}
    workspace = Workspace()  # each result is written out before the next tensor reuses the memory

    def produce(spec: TensorSpec) -> torch.Tensor:
        it = by_name[spec.name]
        t = src.get(it.name)
        if it.scale_name is None:
            bad = first_non_finite(t)  # copied as is, so a NaN or inf here would reach training unnoticed
            if bad is not None:
                raise CheckpointError(
                    f"{Path(in_root) / task.file}: tensor {it.name!r} holds a non-finite value ({bad[1]}) at {bad[0]}"
                )
            return t
        try:
            return dequantize_fp8_blockwise(t, src.get(it.scale_name), block, workspace=workspace)
        except ValueError as err:
            raise CheckpointError(f"{Path(in_root) / task.file}: tensor {it.name!r}: {err}") from None

    try:
        with atomic_path(Path(out_root) / task.file) as tmp:
            size, sha = write_safetensors_file(tmp, specs, produce, {"format": "pt"})
    finally:
        src.close()
    return {
        "file": task.file,
        "size": size,
        "sha256": sha,
        "tensors": len(specs),
        "dequantized": sum(1 for it in task.items if it.scale_name),
    }


def _manifest_key(index: CheckpointIndex, block: tuple[int, int], keep_layers_below: int | None) -> dict[str, Any]:
    return {
        "tool": "verl_patches.weights.fp8_cast",
        "version": 1,
        "source": index.fingerprint(),
        "block": list(block),
        "keep_layers_below": keep_layers_below,
    }


def _shard_is_done(out: Path, fname: str, entry: Mapping[str, Any] | None) -> bool:
    path = out / fname
    if not entry or not path.is_file() or path.stat().st_size != entry.get("size"):
        return False
    return file_sha256(path) == entry.get("sha256")


def run_fp8_cast(
    input_dir: str | Path,
    output_dir: str | Path,
    *,
    workers: int = 1,
    drop_mtp: bool = False,
    overwrite: bool = False,
    progress: bool = True,
) -> CastReport:
    """Convert ``input_dir`` (FP8 HF checkpoint) into ``output_dir`` (BF16). See the module docstring."""
    inp, out = Path(input_dir), Path(output_dir)
    if inp.resolve() == out.resolve():
        raise ResumeError(f"{out}: output directory must differ from the input directory")
    cfg = read_config_json(inp)
    where = str(inp / CONFIG_FILE)
    block = block_size_from_config(cfg, where)
    layers = cfg.get("num_hidden_layers")
    if drop_mtp and not isinstance(layers, int):
        raise ConfigError(f"{where}: key 'num_hidden_layers' is needed to drop the MTP layers")
    keep_below = layers if drop_mtp else None

    index = CheckpointIndex.load(inp)
    carried = carried_over_files(inp)  # a refused symlink stops the run before anything is written
    headers = {f: read_header(inp / f) for f in index.files()}
    # a shard holding only scales or dropped MTP tensors has no output file
    tasks = [t for t in plan_fp8_cast(index, headers, block, keep_below) if t.items]

    key = _manifest_key(index, block, keep_below)
    plan = plan_output(out, key, overwrite, "shards", MANIFEST_FILE, is_shard_file_name, "shard file")
    manifest = plan.manifest
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out)
    extra_files = [INDEX_FILE, CONFIG_FILE, *(p.name for p in carried)]
    # only files our earlier manifest lists: shards of an earlier, different conversion would not match the
    # new index; nothing else in the folder is ours to delete
    remove_listed(out, plan.previous, "shards", keep={t.file for t in tasks}, keep_files=set(extra_files))
    manifest["complete"] = False
    # recorded before anything is written: a run killed half-way still owns what it wrote
    manifest[FILES_KEY] = sorted(set(manifest.get(FILES_KEY, [])) | set(extra_files))
    write_json_atomically(out / MANIFEST_FILE, manifest)

    report = CastReport(total=len(tasks))
    report.tensors_dropped = sum(1 for n in index.weight_map if not n.endswith(SCALE_SUFFIX)) - sum(
        len(t.items) for t in tasks
    )
    todo = []
    for t in tasks:
        if _shard_is_done(out, t.file, manifest["shards"].get(t.file)):
            report.skipped.append(t.file)
        else:
            manifest["shards"].pop(t.file, None)
            todo.append(t)

    def record(job: tuple, result: dict[str, Any]) -> None:
        manifest["shards"][result["file"]] = {k: result[k] for k in ("size", "sha256", "tensors")}
        write_json_atomically(out / MANIFEST_FILE, manifest)
        report.written.append(result["file"])
        report.tensors_dequantized += result["dequantized"]

    if todo:  # not loadable while shards are missing
        (out / INDEX_FILE).unlink(missing_ok=True)
        (out / CONFIG_FILE).unlink(missing_ok=True)
    jobs = [(str(inp), str(out), t, block) for t in todo]
    run_tasks(
        cast_shard,
        jobs,
        [t.in_bytes for t in todo],
        workers=workers,
        on_result=record,
        desc="fp8->bf16",
        progress=progress,
    )

    weight_map = {it.name: t.file for t in tasks for it in t.items}
    total = sum(TensorSpec(it.name, it.dtype, it.shape).nbytes for t in tasks for it in t.items)
    report.out_bytes = total
    finish_hf_folder(out, weight_map, total, cfg, carried, manifest, MANIFEST_FILE, drop_mtp=drop_mtp)
    return report
