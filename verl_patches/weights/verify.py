"""Tensor-by-tensor verification of converted checkpoints (``--verify`` of the CLIs).

* FP8 -> BF16: the output index and shards agree; no scale tensor and no ``quantization_config`` is left;
  every dequantised tensor is within BF16 rounding of the float32 reference ``W.float() * scale``
  (``|out - ref| <= |ref| * 2**-8``), every other tensor is bit-identical to its source.
* HF <-> Megatron (either direction): every rank file holds exactly the planned keys, and each tensor is
  bit-identical to the one derived from the HF checkpoint by the forward layout; then every tensor of the HF
  checkpoint (each one its index lists, not only those the plan knows: a tensor with no Megatron place is a
  failure, not a skip) reassembled from the ranks by the reverse layout is bit-identical to it. Checking each
  direction with the other direction's code means a layout bug on either side shows up.

Counts are of input tensors: every tensor of the source is accounted for (converted, consumed as a scale, or
dropped as asked), so "verify: OK" cannot hide a tensor the conversion left out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_patches.weights.config import CONFIG_FILE, read_config_json
from verl_patches.weights.dequant import dequantize_fp8_reference
from verl_patches.weights.errors import VerifyError
from verl_patches.weights.fp8_cast import SCALE_SUFFIX, block_size_from_config
from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.hf_to_mcore import build_rank_state_dict, rank_sizes
from verl_patches.weights.layout import ParallelLayout, all_ranks
from verl_patches.weights.mcore_to_hf import RankStore, check_rank_files, hf_tensor_from_ranks, read_tracker
from verl_patches.weights.parallel import progress_bar, run_tasks
from verl_patches.weights.st_reader import CheckpointIndex, LazyCheckpoint, read_header

BF16_REL_TOL = 2.0**-8
_TINY = 2.0**-133  # one BF16 subnormal step: the rounding slack for results in the subnormal range


@dataclass
class VerifyReport:
    tensors_checked: int = 0
    tensors_exact: int = 0
    tensors_dequantized: int = 0
    max_rel_err: float = 0.0
    input_tensors: int = 0  # tensors of the source checkpoint, every one accounted for
    scales_consumed: int = 0  # FP8 -> BF16: source scale tensors folded into their weights
    dropped: int = 0  # FP8 -> BF16 with --drop-mtp: source tensors of the MTP layer
    rank_tensors: int = 0  # HF <-> Megatron: rank tensors compared with the ones derived from HF
    hf_tensors: int = 0  # HF <-> Megatron: HF tensors reassembled from the ranks and compared


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8), b.contiguous().reshape(-1).view(torch.uint8))


def check_index_consistent(root: Path) -> CheckpointIndex:
    """Every file in the index exists and holds exactly the tensors the index assigns to it."""
    index = CheckpointIndex.load(root)
    if not index.has_index_file:
        raise VerifyError(f"{root}: no model.safetensors.index.json")
    for fname in index.files():
        listed = set(index.tensors_in(fname))
        present = set(read_header(root / fname))
        if listed != present:
            diff = sorted(listed ^ present)[0]
            where = "missing from the shard" if diff in listed else "not in the index"
            raise VerifyError(f"{root / fname}: tensor {diff!r} is {where}")
    total = index.metadata.get("total_size")
    if total is not None:
        actual = sum(tensor_bytes(root / f) for f in index.files())
        if total != actual:
            raise VerifyError(
                f"{root}/model.safetensors.index.json: metadata.total_size {total} != {actual} bytes of tensors"
            )
    return index


def tensor_bytes(path: Path) -> int:
    """Bytes of tensor data in a safetensors file, from its header."""
    return sum(
        torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        for dtype, shape in read_header(path).values()
    )


def _verify_fp8_shard(job: tuple[str, str, str, list[str], tuple[int, int]]) -> dict[str, Any]:
    in_root, out_root, out_file, names, block = job
    src = LazyCheckpoint(CheckpointIndex.load(in_root), max_open=2)
    dst = LazyCheckpoint(CheckpointIndex.load(out_root), max_open=1)
    exact = deq = 0
    worst = 0.0
    try:
        for name in names:
            got = dst.get(name)
            scale_name = name + SCALE_SUFFIX
            if scale_name in src.index:
                try:
                    ref = dequantize_fp8_reference(src.get(name), src.get(scale_name), block)
                except ValueError as err:  # a scale that is not finite and positive: named, never a traceback
                    raise VerifyError(f"{Path(in_root)}: tensor {name!r}: {err}") from None
                if got.dtype != torch.bfloat16 or tuple(got.shape) != tuple(ref.shape):
                    raise VerifyError(
                        f"{Path(out_root) / out_file}: tensor {name!r} is {got.dtype} {tuple(got.shape)}, "
                        f"expected bfloat16 {tuple(ref.shape)}"
                    )
                err = (got.float() - ref).abs()
                bound = ref.abs() * BF16_REL_TOL + _TINY
                if not bool((err <= bound).all()):
                    i = int((err - bound).argmax())
                    raise VerifyError(
                        f"{Path(out_root) / out_file}: tensor {name!r} differs from the float32 reference "
                        f"beyond BF16 rounding at flat index {i} "
                        f"({got.reshape(-1)[i].item()} vs {ref.reshape(-1)[i].item()})"
                    )
                rel = (err / ref.abs().clamp_min(1e-30)).max().item() if err.numel() else 0.0
                worst = max(worst, rel)
                deq += 1
            else:
                if not same_bits(got, src.get(name)):
                    raise VerifyError(f"{Path(out_root) / out_file}: tensor {name!r} differs from the source")
                exact += 1
    finally:
        src.close()
        dst.close()
    return {"exact": exact, "dequantized": deq, "max_rel_err": worst}


def verify_fp8_cast(
    input_dir: str | Path, output_dir: str | Path, *, workers: int = 1, progress: bool = True
) -> VerifyReport:
    inp, out = Path(input_dir), Path(output_dir)
    src_cfg = read_config_json(inp)
    block = block_size_from_config(src_cfg, str(inp / CONFIG_FILE))
    out_cfg = read_config_json(out)
    if "quantization_config" in out_cfg:
        raise VerifyError(f"{out / CONFIG_FILE}: key 'quantization_config' is still present")
    changed = {"quantization_config", "torch_dtype", "num_nextn_predict_layers"}
    for key in sorted((set(src_cfg) | set(out_cfg)) - changed):
        if src_cfg.get(key) != out_cfg.get(key):
            raise VerifyError(f"{out / CONFIG_FILE}: key {key!r} differs from the source config")
    index = check_index_consistent(out)
    scales = [n for n in index.weight_map if n.endswith(SCALE_SUFFIX)]
    if scales:
        raise VerifyError(f"{out}/model.safetensors.index.json: scale tensor {scales[0]!r} is still listed")
    src_index = CheckpointIndex.load(inp)
    expected = {n for n in src_index.weight_map if not n.endswith(SCALE_SUFFIX)}
    missing = sorted(expected - set(index.weight_map))
    dropped_mtp = out_cfg.get("num_nextn_predict_layers") == 0 and src_cfg.get("num_nextn_predict_layers", 0) > 0
    dropped: set[str] = set()
    if dropped_mtp:
        n = out_cfg["num_hidden_layers"]
        dropped = {
            m
            for m in missing
            if m.startswith("model.layers.")
            and m.split(".")[2].isascii()
            and m.split(".")[2].isdigit()
            and int(m.split(".")[2]) >= n
        }
        missing = [m for m in missing if m not in dropped]
    if missing:
        raise VerifyError(f"{out}: tensor {missing[0]!r} of the source is missing from the output")
    extra = sorted(set(index.weight_map) - expected)
    if extra:
        raise VerifyError(f"{out}: tensor {extra[0]!r} is not in the source")
    jobs = [(str(inp), str(out), f, index.tensors_in(f), block) for f in index.files()]
    weights = [tensor_bytes(out / f) for f in index.files()]
    report = VerifyReport()
    for r in run_tasks(_verify_fp8_shard, jobs, weights, workers=workers, desc="verify fp8->bf16", progress=progress):
        report.tensors_exact += r["exact"]
        report.tensors_dequantized += r["dequantized"]
        report.max_rel_err = max(report.max_rel_err, r["max_rel_err"])
    report.tensors_checked = report.tensors_exact + report.tensors_dequantized
    report.scales_consumed = sum(1 for n in src_index.weight_map if n.endswith(SCALE_SUFFIX))
    report.dropped = len(dropped)
    report.input_tensors = len(src_index.weight_map)
    accounted = report.tensors_checked + report.scales_consumed + report.dropped
    if accounted != report.input_tensors:
        raise VerifyError(
            f"{inp}: {report.input_tensors} input tensors, but only {accounted} were accounted for "
            f"({report.tensors_checked} compared, {report.scales_consumed} scales, {report.dropped} dropped)"
        )
    return report


def verify_hf_mcore_pair(
    hf_dir: str | Path, mcore_dir: str | Path, layout: ParallelLayout, cfg: Mapping[str, Any], *, progress: bool = True
) -> VerifyReport:
    """Rank files vs the HF checkpoint, both ways (see module docstring)."""
    hf, mc = Path(hf_dir), Path(mcore_dir)
    store = RankStore(mc, layout, read_tracker(mc))
    check_rank_files(store, cfg)
    report = VerifyReport()
    index = CheckpointIndex.load(hf)
    specs = hf_tensor_specs(cfg)
    planned = {s.name for s in specs}
    unplanned = sorted(n for n in index.weight_map if n not in planned)
    if unplanned:
        raise VerifyError(
            f"{hf}: tensor {unplanned[0]!r} of the HF checkpoint has no counterpart in the Megatron "
            f"checkpoint {mc} ({len(unplanned)} such tensor(s)); the conversion left it out"
        )
    absent = [s.name for s in specs if s.name not in index.weight_map]
    if absent:
        raise VerifyError(f"{hf}: tensor {absent[0]!r} of the model is not in the HF checkpoint")
    total = sum(rank_sizes(cfg, layout).values()) + sum(s.nbytes for s in specs)
    with LazyCheckpoint(index, max_open=2) as src, progress_bar(total, "verify", progress) as bar:
        for rank in all_ranks(layout):
            expected = build_rank_state_dict(src, cfg, layout, rank)
            actual = store.state_dict(rank)
            for key, want in expected.items():
                if not same_bits(actual[key], want):
                    raise VerifyError(
                        f"{store.path(rank)}: tensor {key!r} differs from the one derived from the HF checkpoint {hf}"
                    )
                report.tensors_checked += 1
                report.rank_tensors += 1
                bar.update(want.numel() * want.element_size())
            del expected, actual
            store.clear()
            src.close()
        layer = None
        for spec in specs:
            this_layer = spec.name.split(".")[2] if spec.name.startswith("model.layers.") else spec.name
            if this_layer != layer:  # unmap the previous layer's rank files
                store.clear()
                src.close()
                layer = this_layer
            got = hf_tensor_from_ranks(spec.name, cfg, layout, store.fetch)
            if not same_bits(got, src.get(spec.name)):
                raise VerifyError(
                    f"{hf}: tensor {spec.name!r} reassembled from the Megatron ranks in {mc} differs from the HF tensor"
                )
            report.tensors_checked += 1
            report.hf_tensors += 1
            bar.update(spec.nbytes)
        store.clear()
    report.tensors_exact = report.tensors_checked
    report.input_tensors = len(index.weight_map)
    if report.hf_tensors != report.input_tensors:
        raise VerifyError(f"{hf}: {report.input_tensors} tensors in the HF checkpoint, {report.hf_tensors} compared")
    return report
