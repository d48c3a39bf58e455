"""Legacy Megatron (MindSpeed-LLM DeepSeek-V3) checkpoint -> HF safetensors, so a trained model can be
evaluated and served (the vendor recipe cannot export DeepSeek-V3).

Rank files are read memory-mapped by `checkpoint.safe_load` (one parse by torch's own zip reader, a plain
``torch.save`` archive only, weights-only unpickling): nothing is unpickled but tensors and plain data, and
nothing is read until a tensor's bytes are used.
Each HF tensor is reassembled from the rank tensors that hold its pieces and streamed into the current
output shard, so peak memory is about one tensor plus the pages of the shard being assembled; rank files
are unmapped after every output shard. Output shards are planned from the config (about
``max_shard_bytes`` each), written under temporary names and renamed; a manifest makes the export
resumable; index, config and tokenizer files come last.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from verl_patches.base.atomic_write import (
    atomic_path,
    remove_stale_temps,
    write_json_atomically,
)
from verl_patches.checkpoint.safe_load import CheckpointFileError, load_tensor_file
from verl_patches.checkpoint.tracker import TrackerError, read_megatron_tracker
from verl_patches.weights import tensor_layout as tl
from verl_patches.weights.config import CONFIG_FILE, validate_config
from verl_patches.weights.dequant import first_non_finite
from verl_patches.weights.errors import CheckpointError, ConfigError, LayoutError
from verl_patches.weights.file_digest import file_sha256
from verl_patches.weights.hf_dir import MCORE_TO_HF_MANIFEST, carried_over_files
from verl_patches.weights.hf_output import finish_hf_folder
from verl_patches.weights.hf_schema import hf_layer_shapes, hf_tensor_specs
from verl_patches.weights.hf_to_mcore import (
    CKPT_FILE,
    ITERATION,
    TRACKER_FILE,
    iteration_dir,
    meta_source,
    plan_rank_shapes,
)
from verl_patches.weights.hf_to_mcore import (
    MANIFEST_FILE as MCORE_MANIFEST,
)
from verl_patches.weights.layout import (
    ParallelLayout,
    Rank,
    all_ranks,
    local_experts,
    owners_of_expert,
    rank_dir_name,
    stage_layers,
    validate_layout,
)
from verl_patches.weights.manifest_file import (
    ACTOR_CHECKPOINT_TOOL,
    CONVERTER_TOOL,
    is_shard_file_name,
    read_conversion_manifest,
)
from verl_patches.weights.names import GLOBAL_POST, GLOBAL_PRE, hf_to_mcore_name, layer_rule_for, split_layer_name
from verl_patches.weights.parallel import progress_bar
from verl_patches.weights.resume import FILES_KEY, plan_output, remove_listed
from verl_patches.weights.st_reader import INDEX_FILE
from verl_patches.weights.st_writer import TensorSpec, write_safetensors_file
from verl_patches.weights.write_report import WriteReport

MANIFEST_FILE = MCORE_TO_HF_MANIFEST
DEFAULT_SHARD_BYTES = 5 * 1024**3

Fetch = Callable[[Rank, str], torch.Tensor]


def read_tracker(mcore_dir: Path) -> int | str:
    """The iteration ``latest_checkpointed_iteration.txt`` names (the one strict tracker reader)."""

    p = Path(mcore_dir) / TRACKER_FILE
    if not p.exists() and not p.is_symlink():
        raise CheckpointError(f"{p}: iteration tracker not found (incomplete or not a Megatron checkpoint)")
    try:
        return read_megatron_tracker(p)
    except TrackerError as err:
        raise CheckpointError(str(err)) from None


def _rank_file_globals() -> list[Any]:
    """Data-only types a Megatron rank file holds besides tensors: the training args (a Namespace) and the
    numpy arrays of its RNG states. The weights-only unpickler builds these and nothing else."""
    # lazy: numpy is heavy and only this path needs it; importing this module stays light
    import numpy as np

    try:
        # lazy: numpy is heavy and only this path needs it; importing this module stays light
        from numpy.core.multiarray import _reconstruct
    except ImportError:  # numpy 2 moved it
        # lazy: numpy is heavy and only this path needs it; importing this module stays light
        from numpy._core.multiarray import _reconstruct  # type: ignore[no-redef]
    dtype_classes = {type(np.dtype(c)) for c in "?bBhHiIlLqQefdgFDGUS"}
    return [Namespace, _reconstruct, np.ndarray, np.dtype, *dtype_classes]


def refuse_non_finite(t: torch.Tensor, what: str) -> None:
    """A weight holding NaN or inf is never converted (bit for bit it would reach training or inference)."""
    bad = first_non_finite(t)
    if bad is not None:
        raise CheckpointError(f"{what} holds a non-finite value ({bad[1]}) at {bad[0]}; refused")


def recorded_rank_digests(mcore_dir: Path, iteration: int | str) -> dict[str, str] | None:
    """rank folder name -> the sha256 recorded for that rank's file of ``iteration``: by our converter (its
    manifest, for the iteration it wrote), or, for an actor checkpoint (the role folder of a committed step),
    by the step's checkpoint.json. None when no digest applies (another tool's folder)."""
    man = read_conversion_manifest(mcore_dir, MCORE_MANIFEST)
    if man is None:
        return None
    if man.tool == CONVERTER_TOOL:
        if iteration_dir(iteration) != iteration_dir(ITERATION):
            return None
        return {name: entry["sha256"] for name, entry in man.ranks.items()}
    if man.tool == ACTOR_CHECKPOINT_TOOL:
        # imported here: the checkpoint package builds on this one (its actor folders are in our layout)
        from verl_patches.checkpoint.commit import read_manifest
        from verl_patches.checkpoint.manifest import CheckpointIncomplete

        try:
            files = read_manifest(mcore_dir.parent).role_files(mcore_dir.name)
        except CheckpointIncomplete as err:
            raise CheckpointError(
                f"{mcore_dir}: an actor checkpoint whose step manifest cannot be read ({err})"
            ) from None
        prefix, suffix = iteration_dir(iteration) + "/", "/" + CKPT_FILE
        return {
            rel[len(prefix) : -len(suffix)]: rec.sha256
            for rel, rec in files.items()
            if rel.startswith(prefix) and rel.endswith(suffix)
        }
    return None


def expected_rank_digest(digests: Mapping[str, str] | None, name: str, path: Path) -> str | None:
    """The digest a rank file must have before it is read; a rank the converter's manifest does not list
    (a folder added after the conversion) is refused by name."""
    if digests is None:
        return None
    if name not in digests:
        raise CheckpointError(
            f"{path}: rank folder {name!r} has no recorded digest (not listed in {MCORE_MANIFEST} "
            "or the step's checkpoint.json: added afterwards?); refused unread"
        )
    return digests[name]


def load_rank_file(path: Path, expected_sha256: str | None = None) -> tuple[dict[str, torch.Tensor], Any]:
    """``(model state dict, training args or None)`` of a rank file, memory-mapped and loaded weights-only
    (never unpickling code, whatever the torch version); Megatron's ``_extra_state`` entries dropped. With
    ``expected_sha256`` (the converter's manifest records one per rank) a differing file is refused unread."""

    if not path.is_file():
        raise CheckpointError(f"{path}: rank file not found")
    try:
        obj = load_tensor_file(path, mmap=True, safe_globals=_rank_file_globals(), expected_sha256=expected_sha256)
    except CheckpointFileError as err:
        raise CheckpointError(str(err)) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("model"), dict):
        keys = sorted(map(str, obj))[:5] if isinstance(obj, dict) else type(obj).__name__
        hint = " (virtual pipeline checkpoints are not supported)" if isinstance(obj, dict) and "model0" in obj else ""
        raise CheckpointError(f"{path}: no 'model' state dict (found {keys}){hint}")
    model = {k: v for k, v in obj["model"].items() if not str(k).endswith("_extra_state")}
    bad = next((k for k, v in model.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)), None)
    if bad is not None:
        raise CheckpointError(f"{path}: model entry {str(bad)[:80]!r} is not a tensor")
    args = obj.get("args")
    return model, args if isinstance(args, Namespace) else None


# training args that fix the layout; a trained checkpoint carries them, so wrong flags are caught
# (TP-extend-EP and plain EP give identical tensor shapes: only the args can tell them apart)
_ARGS_FIELDS = (
    ("tensor_model_parallel_size", "tp"),
    ("pipeline_model_parallel_size", "pp"),
    ("expert_model_parallel_size", "ep"),
    ("moe_grouped_gemm", "moe_grouped_gemm"),
    ("moe_tp_extend_ep", "moe_tp_extend_ep"),
)


def check_args_match_layout(args: Any, layout: ParallelLayout, where: Path) -> None:
    for arg, attr in _ARGS_FIELDS:
        if args is not None and hasattr(args, arg) and getattr(args, arg) is not None:
            have, want = getattr(args, arg), getattr(layout, attr)
            if (bool(have) != want) if isinstance(want, bool) else (int(have) != want):
                raise LayoutError(
                    f"{where}: the checkpoint was trained with {arg}={have!r}, the layout flags say {want!r}"
                )


def hf_tensor_from_ranks(name: str, cfg: Mapping[str, Any], layout: ParallelLayout, fetch: Fetch) -> torch.Tensor:
    """Reassemble HF tensor ``name`` from the rank tensors that hold its pieces."""
    tp = layout.tp
    key, pos = hf_to_mcore_name(name, layout.moe_grouped_gemm)
    for rules, pp in ((GLOBAL_PRE, 0), (GLOBAL_POST, layout.pp - 1)):
        for rule in rules:
            if key == rule.mcore:
                if rule.kind == "replicated":
                    return fetch(Rank(0, pp, 0), key)
                return tl.merge_tp_rows([fetch(Rank(t, pp, 0), key) for t in range(tp)])
    split = split_layer_name(key)
    if split is None:
        raise CheckpointError(f"tensor {name!r}: no Megatron counterpart")
    layer, rest = split
    stages = stage_layers(layout, cfg["num_hidden_layers"])
    pp = next(s for s, layers in enumerate(stages) if layer in layers)
    prefix = f"decoder.layers.{stages[pp].index(layer)}."
    rule, expert = layer_rule_for(rest)
    hidden, n_exp = cfg["hidden_size"], cfg["n_routed_experts"]
    tp_ranks = [Rank(t, pp, 0) for t in range(tp)]

    if rule.kind == "grouped_w1" or rule.kind == "grouped_w2":
        e = pos // len(rule.hf)
        pieces = []
        for r in owners_of_expert(layout, n_exp, e, pp):
            mine = local_experts(layout, n_exp, r)
            w = fetch(r, prefix + rest)
            if rule.kind == "grouped_w1":
                pieces.append(tl.expert_from_w1(w, len(mine), hidden, e - mine.start, pos % 2))
            else:
                pieces.append(tl.expert_from_w2(w, len(mine), hidden, e - mine.start))
        return torch.cat(pieces, dim=0 if rule.kind == "grouped_w1" else 1)
    if expert is not None:  # non-grouped local experts: the key carries the local index on the owner
        owners = owners_of_expert(layout, n_exp, expert, pp)
        j = expert - local_experts(layout, n_exp, owners[0]).start
        local_key = prefix + rule.mcore.format(expert=j)
        parts = [fetch(r, local_key) for r in owners]
        return tl.merge_gate_up(parts, pos) if rule.kind == "gate_up" else tl.merge_tp_cols(parts)
    full_key = prefix + rest
    if rule.kind == "replicated":
        return fetch(tp_ranks[0], full_key)
    if rule.kind == "concat_rows":
        shapes = hf_layer_shapes(cfg, layer)
        hp = f"model.layers.{layer}."
        return tl.split_concat_rows(fetch(tp_ranks[0], full_key), [shapes[hp + h][0] for h in rule.hf], pos)
    parts = [fetch(r, full_key) for r in tp_ranks]
    if rule.kind == "tp_rows":
        return tl.merge_tp_rows(parts)
    if rule.kind == "tp_cols":
        return tl.merge_tp_cols(parts)
    if rule.kind == "gate_up":
        return tl.merge_gate_up(parts, pos)
    raise ValueError(f"unknown layout kind {rule.kind!r}")


class RankStore:
    """Memory-mapped rank state dicts, opened on first use and unmapped by ``clear``."""

    def __init__(self, mcore_dir: Path, layout: ParallelLayout, iteration: int | str):
        self.root = mcore_dir / iteration_dir(iteration)
        self.layout = layout
        self._open: dict[Rank, dict[str, torch.Tensor]] = {}
        self.args: Any = None
        self.digests = recorded_rank_digests(mcore_dir, iteration)  # checked before a rank file is read

    def path(self, rank: Rank) -> Path:
        return self.root / rank_dir_name(self.layout, rank) / CKPT_FILE

    def state_dict(self, rank: Rank) -> dict[str, torch.Tensor]:
        if rank not in self._open:
            name = rank_dir_name(self.layout, rank)
            sd, args = load_rank_file(self.path(rank), expected_rank_digest(self.digests, name, self.path(rank)))
            if args is not None and self.args is None:
                check_args_match_layout(args, self.layout, self.path(rank))
                self.args = args
            self._open[rank] = sd
        return self._open[rank]

    def fetch(self, rank: Rank, key: str) -> torch.Tensor:
        sd = self.state_dict(rank)
        if key not in sd:
            raise CheckpointError(f"{self.path(rank)}: tensor {key!r} is missing")
        return sd[key]

    def clear(self) -> None:
        self._open.clear()


def check_rank_files(store: RankStore, cfg: Mapping[str, Any]) -> None:
    """Each rank file exists and holds exactly the planned keys with the planned shapes (before any work)."""
    meta = meta_source(cfg)
    for rank in all_ranks(store.layout):
        sd = store.state_dict(rank)
        plan = plan_rank_shapes(cfg, store.layout, rank, meta)
        extra = sorted(set(sd) - set(plan))
        missing = [k for k in plan if k not in sd]
        if missing:
            raise CheckpointError(
                f"{store.path(rank)}: tensor {missing[0]!r} is missing ({len(missing)} missing; wrong layout flags?)"
            )
        if extra:
            raise CheckpointError(
                f"{store.path(rank)}: unexpected tensor {extra[0]!r} ({len(extra)} unexpected; "
                f"MTP layers, VPP and mla-mm-split checkpoints are not supported)"
            )
        for k, (shape, _) in plan.items():
            if tuple(sd[k].shape) != shape:
                raise CheckpointError(
                    f"{store.path(rank)}: tensor {k!r} has shape {tuple(sd[k].shape)}, "
                    f"expected {shape} for this layout and config"
                )
        store.clear()


def plan_hf_shards(specs: list[TensorSpec], max_bytes: int) -> list[list[TensorSpec]]:
    """Greedy, order-preserving grouping into shards of at most ``max_bytes`` (a bigger tensor stands alone)."""
    shards: list[list[TensorSpec]] = []
    cur: list[TensorSpec] = []
    size = 0
    for s in specs:
        if cur and size + s.nbytes > max_bytes:
            shards.append(cur)
            cur, size = [], 0
        cur.append(s)
        size += s.nbytes
    if cur:
        shards.append(cur)
    return shards


def resolve_layout_and_config(
    mcore_dir: Path, layout: ParallelLayout | None, config: Mapping[str, Any] | None
) -> tuple[ParallelLayout, dict[str, Any]]:
    """Layout and HF config from the converter's manifest, or from the caller; a conflict is an error."""
    man = read_conversion_manifest(mcore_dir, MCORE_MANIFEST)
    if man is not None:
        if layout is not None and layout != man.layout:
            raise LayoutError(
                f"{man.path}: the checkpoint was written with layout "
                f"{man.layout.to_json()}, the flags say {layout.to_json()}"
            )
        layout = man.layout
        if config is None:
            config = man.hf_config
    if layout is None:
        raise LayoutError(
            f"{mcore_dir}: no {MCORE_MANIFEST}; give the layout flags "
            f"(--target-tensor-parallel-size, ..., --moe-grouped-gemm, --moe-tp-extend-ep)"
        )
    if config is None:
        raise ConfigError(f"{mcore_dir}: no {MCORE_MANIFEST}; give --config (the model's config.json)")
    cfg = dict(config)
    validate_config(cfg, where="config")
    validate_layout(layout, cfg)
    return layout, cfg


def _source_fingerprint(store: RankStore) -> list[list[Any]]:
    out = []
    for rank in all_ranks(store.layout):
        st = store.path(rank).stat()
        out.append([rank_dir_name(store.layout, rank), st.st_size, st.st_mtime_ns])
    return out


def convert_mcore_to_hf(
    load_dir: str | Path,
    save_dir: str | Path,
    *,
    layout: ParallelLayout | None = None,
    config: Mapping[str, Any] | None = None,
    iteration: int | str | None = None,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    tokenizer_dir: str | Path | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> WriteReport:
    load, save = Path(load_dir), Path(save_dir)
    layout, cfg = resolve_layout_and_config(load, layout, config)
    it = read_tracker(load) if iteration is None else iteration
    store = RankStore(load, layout, it)
    check_rank_files(store, cfg)

    specs_cfg = hf_tensor_specs(cfg)

    def meta_fetch(rank: Rank, k: str) -> torch.Tensor:  # dtype and shape only: no data is read
        return torch.empty_like(store.fetch(rank, k), device="meta")

    dtypes = {s.name: hf_tensor_from_ranks(s.name, cfg, layout, meta_fetch).dtype for s in specs_cfg}
    store.clear()
    specs = [TensorSpec(s.name, dtypes[s.name], s.shape) for s in specs_cfg]
    shards = plan_hf_shards(specs, max_shard_bytes)
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]

    key = {
        "tool": "verl_patches.weights.mcore_to_hf",
        "version": 1,
        "source": _source_fingerprint(store),
        "iteration": it,
        "layout": layout.to_json(),
        "hf_config": cfg,
        "max_shard_bytes": max_shard_bytes,
    }
    plan = plan_output(save, key, overwrite, "shards", MANIFEST_FILE, is_shard_file_name, "shard file")
    manifest = plan.manifest
    tokenizer_files = []
    if tokenizer_dir is not None:
        tdir = Path(tokenizer_dir)
        if not tdir.is_dir():
            raise CheckpointError(f"{tdir}: tokenizer directory not found")
        tokenizer_files = carried_over_files(tdir)  # a refused symlink stops the run before anything is written
    extra_files = [INDEX_FILE, CONFIG_FILE, *(p.name for p in tokenizer_files)]
    save.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(save)
    # only what our earlier manifest lists: shards of an earlier, different export would not match the new index
    remove_listed(save, plan.previous, "shards", keep=set(files), keep_files=set(extra_files))
    manifest["complete"] = False
    manifest[FILES_KEY] = sorted(set(manifest.get(FILES_KEY, [])) | set(extra_files))
    write_json_atomically(save / MANIFEST_FILE, manifest)
    report = WriteReport("shard", total=len(shards))
    todo = []
    for fname, group in zip(files, shards):
        e = manifest["shards"].get(fname)
        p = save / fname
        if e and p.is_file() and p.stat().st_size == e["size"] and file_sha256(p) == e["sha256"]:
            report.skipped.append(fname)
        else:
            manifest["shards"].pop(fname, None)
            todo.append((fname, group))

    if todo:  # not loadable while shards are missing
        (save / INDEX_FILE).unlink(missing_ok=True)
        (save / CONFIG_FILE).unlink(missing_ok=True)
    with progress_bar(sum(s.nbytes for _, g in todo for s in g), "mcore->hf", progress) as bar:
        for fname, group in todo:

            def produce(spec: TensorSpec) -> torch.Tensor:
                t = hf_tensor_from_ranks(spec.name, cfg, layout, store.fetch)
                refuse_non_finite(t, f"{load}: tensor {spec.name!r} (from the rank files)")
                bar.update(spec.nbytes)
                return t

            try:
                with atomic_path(save / fname) as tmp:
                    size, sha = write_safetensors_file(tmp, group, produce, {"format": "pt"})
            finally:
                store.clear()
            manifest["shards"][fname] = {"size": size, "sha256": sha, "tensors": len(group)}
            write_json_atomically(save / MANIFEST_FILE, manifest)
            report.written.append(fname)

    weight_map = {s.name: f for f, g in zip(files, shards) for s in g}
    report.out_bytes = sum(s.nbytes for s in specs)
    # drop_mtp: the Megatron checkpoint has no MTP layer
    finish_hf_folder(save, weight_map, report.out_bytes, cfg, tokenizer_files, manifest, MANIFEST_FILE, drop_mtp=True)
    return report
