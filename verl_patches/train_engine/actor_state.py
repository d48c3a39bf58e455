"""Per-rank save and load of a Megatron actor: model shards, (distributed) optimizer state, RNG states.

The step checkpoint's format (`verl_patches.checkpoint`) sits below the weights tools; the actor's shards are
written in the weights tools' converter layout, so this module, which needs both, lives with the engine.

Called by every rank of the actor with the same role folder (verl's ONE_TO_ALL ``save_checkpoint`` /
``load_checkpoint``). Who writes what:

* model shard of model-parallel rank (tp, pp, ep): the rank with expert-data-parallel rank 0 of that
  triple (with EP > 1 the dense DP-0 rank holds only one EP rank's experts), in our converter's legacy
  layout, so ``convert_ckpt_deepseek3.py --reverse`` exports it and C1's loader can start a new run from it;
* optimizer: every rank takes part in Megatron's DP gather (``save_parameter_state``); the file of
  (tp, pp, ep) is written by the same rank; ``state_dict()`` (param groups with Adam's step and lr, grad
  scaler; the full state for a non-distributed optimizer) goes beside it;
* RNG: every rank, its own file (tracker streams differ per TP/EP rank);
* ``ranks/rank_R.json`` last: what rank R wrote; the driver refuses to commit without all of them.

Every file is recorded with its sha256, hashed by the rank that wrote it. Loading reads the same files back
from a committed step only: each through `safe_load.load_tensor_file` (weights only, never unpickling code),
after its sha256 is checked against the step manifest (a changed file is refused by name, unread), and by
a name confined to the step folder. A layout that differs in more than the DP size is refused before
anything is read (`manifest.check_resume_layout`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from verl_patches.base.atomic_write import (
    commit,
    discard,
    temp_path_for,
    write_atomically,
    write_json_atomically,
    write_text_atomically,
)
from verl_patches.checkpoint import rng
from verl_patches.checkpoint.committed_role import CommittedRole, saved_layout
from verl_patches.checkpoint.manifest import (
    CheckpointIncomplete,
    RankRecord,
    TrainLayout,
    check_resume_layout,
    rank_record_name,
)
from verl_patches.checkpoint.optimizer_state import load_parameter_state
from verl_patches.checkpoint.safe_load import sha256_file
from verl_patches.checkpoint.tracker import TrackerError, read_tracker
from verl_patches.weights.hf_to_mcore import CKPT_FILE, TRACKER_FILE, iteration_dir
from verl_patches.weights.hf_to_mcore import MANIFEST_FILE as CONVERTER_MANIFEST
from verl_patches.weights.layout import ParallelLayout, Rank, rank_dir_name

OPTIM_DIR = "optim"
RNG_DIR = "rng"


@dataclass(frozen=True)
class RankPlace:
    """This process's coordinates in the running layout."""

    rank: int
    tp_rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    expert_dp_rank: int  # rank in the data-parallel group of the expert parameters (DP / EP ranks)


def running_place(use_distributed_optimizer: bool) -> tuple[RankPlace, TrainLayout, bool]:
    """(place, layout, moe_grouped_gemm) from Megatron's parallel state and, when set, its global args."""
    # deferred: importing this module must not load Megatron; it loads once the prelude patched it
    from megatron.core import parallel_state as mpu

    args: Any = None
    try:
        # deferred: importing this module must not load Megatron; it loads once the prelude patched it
        from megatron.training import get_args

        args = get_args()
    except (ImportError, AssertionError):
        pass
    nll = getattr(args, "num_layer_list", None)
    if isinstance(nll, str):
        nll = tuple(int(x) for x in nll.split(","))
    pp = mpu.get_pipeline_model_parallel_world_size()
    layout = TrainLayout(
        tp=mpu.get_tensor_model_parallel_world_size(),
        pp=pp,
        ep=mpu.get_expert_model_parallel_world_size(),
        cp=mpu.get_context_parallel_world_size(),
        dp=mpu.get_data_parallel_world_size(),
        num_layer_list=tuple(nll) if nll and pp > 1 else None,
        moe_tp_extend_ep=bool(getattr(args, "moe_tp_extend_ep", False)),
        use_distributed_optimizer=bool(use_distributed_optimizer),
    )
    place = RankPlace(
        rank=torch.distributed.get_rank(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        dp_rank=mpu.get_data_parallel_rank(),
        expert_dp_rank=mpu.get_data_modulo_expert_parallel_rank(),
    )
    return place, layout, bool(getattr(args, "moe_grouped_gemm", False))


def converter_layout(layout: TrainLayout, moe_grouped_gemm: bool) -> ParallelLayout:
    return ParallelLayout(
        tp=layout.tp,
        pp=layout.pp,
        ep=layout.ep,
        num_layer_list=layout.num_layer_list,
        moe_grouped_gemm=moe_grouped_gemm,
        moe_tp_extend_ep=layout.moe_tp_extend_ep,
    )


def model_file(step: int, layout: TrainLayout, moe_grouped_gemm: bool, coords: tuple[int, int, int]) -> str:
    tp, pp, ep = coords
    return (
        f"{iteration_dir(step)}/{rank_dir_name(converter_layout(layout, moe_grouped_gemm), Rank(tp, pp, ep))}/"
        f"{CKPT_FILE}"
    )


def _mp_name(coords: tuple[int, int, int]) -> str:
    return f"mp_rank_{coords[0]:02d}_{coords[1]:03d}_{coords[2]:03d}"


def optim_params_file(coords: tuple[int, int, int]) -> str:
    return f"{OPTIM_DIR}/{_mp_name(coords)}_params.pt"


def optim_common_file(coords: tuple[int, int, int]) -> str:
    return f"{OPTIM_DIR}/{_mp_name(coords)}_common.pt"


def rng_file(rank: int) -> str:
    return f"{RNG_DIR}/rank_{rank:05d}.pt"


def _unwrap(module: torch.nn.Module) -> torch.nn.Module:
    while hasattr(module, "module"):
        module = module.module
    return module


def model_state(modules: Sequence[torch.nn.Module]) -> dict[str, torch.Tensor]:
    if len(modules) != 1:
        raise NotImplementedError(
            "virtual pipeline stages are not supported by the actor checkpoint "
            f"({len(modules)} model chunks on this rank)"
        )
    return {
        k: v.detach().cpu()
        for k, v in _unwrap(modules[0]).state_dict().items()
        if not k.endswith("_extra_state") and isinstance(v, torch.Tensor)
    }


def optimizer_has_stepped(optimizer: Any) -> bool:
    """Whether Adam holds moments yet (Megatron's DP gather of the state needs them)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is not None and len(getattr(inner, "state", {})) > 0:
            return True
    return False


class _Written:
    """The files this rank wrote, relative to the role folder: bytes and sha256 (hashed here, where the
    file was just written, so the driver never reads the large files again)."""

    def __init__(self, role: Path) -> None:
        self.role, self.sizes, self.sha256 = role, {}, {}

    def add(self, rel: str) -> None:
        path = self.role / rel
        self.sizes[rel], self.sha256[rel] = path.stat().st_size, sha256_file(path)

    def save(self, obj: Any, rel: str) -> None:
        write_atomically(self.role / rel, lambda p: torch.save(obj, p))
        self.add(rel)


def save_actor(
    role_dir: str | os.PathLike,
    step: int,
    modules: Sequence[torch.nn.Module],
    optimizer: Any,
    hf_config: Mapping[str, Any] | None,
    use_distributed_optimizer: bool,
) -> RankRecord:
    """This rank's part of the actor checkpoint of ``step``; a collective over all actor ranks."""
    role = Path(role_dir)
    place, layout, grouped = running_place(use_distributed_optimizer)
    coords = (place.tp_rank, place.pp_rank, place.ep_rank)
    writer = place.expert_dp_rank == 0  # one writer per (tp, pp, ep)
    out = _Written(role)

    if writer:
        out.save(
            {"model": model_state(modules), "iteration": step, "checkpoint_version": 3.0},
            model_file(step, layout, grouped, coords),
        )
    if optimizer is not None:
        (role / OPTIM_DIR).mkdir(parents=True, exist_ok=True)
        stepped = optimizer_has_stepped(optimizer)  # the same on every rank: they step together
        if stepped and hasattr(optimizer, "save_parameter_state") and use_distributed_optimizer:
            rel = optim_params_file(coords)
            tmp = temp_path_for(role / rel)  # one per rank: every rank joins the gather, DP rank 0 writes
            try:
                optimizer.save_parameter_state(str(tmp))  # collective: the DP gather
                written = tmp.stat().st_size > 0  # torch.save never writes an empty file
            except BaseException:
                discard(tmp)
                raise
            if written:
                commit(tmp, role / rel)
                out.add(rel)
            else:
                discard(tmp)
        if writer:
            out.save(
                {"stepped": stepped, "state_dict": optimizer.state_dict() if stepped else None},
                optim_common_file(coords),
            )
    out.save(rng.capture(), rng_file(place.rank))

    if place.rank == 0:  # our converter's files: the export tool and C1's loader read this folder as is
        write_json_atomically(
            role / CONVERTER_MANIFEST,
            {
                "tool": "verl_patches.checkpoint",
                "complete": True,
                "layout": converter_layout(layout, grouped).to_json(),
                "hf_config": dict(hf_config) if hf_config is not None else None,
                "iteration": step,
            },
        )
        write_text_atomically(role / TRACKER_FILE, str(step))
        out.add(CONVERTER_MANIFEST)
        out.add(TRACKER_FILE)
    record = RankRecord(
        rank=place.rank,
        layout=layout,
        tp_rank=place.tp_rank,
        pp_rank=place.pp_rank,
        ep_rank=place.ep_rank,
        dp_rank=place.dp_rank,
        files=out.sizes,
        sha256=out.sha256,
    )
    write_json_atomically(role / rank_record_name(place.rank), record.to_json())
    return record


def load_model_into(modules: Sequence[torch.nn.Module], committed: CommittedRole, rel: str) -> None:
    """Strict, shape-checked copy of the saved shard into this rank's model."""
    if len(modules) != 1:
        raise NotImplementedError("virtual pipeline stages are not supported by the actor checkpoint")
    path, _ = committed.path(rel)
    state = committed.load(rel)
    module = _unwrap(modules[0])
    own = {k: v for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    saved = state.get("model") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        raise CheckpointIncomplete(f"{path}: no 'model' state dict")
    missing, extra = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
    if missing or extra:
        raise CheckpointIncomplete(
            f"{path}: parameters do not match the model built here: missing {missing[:5]}, unexpected {extra[:5]}"
        )
    for k, v in own.items():
        if not isinstance(saved[k], torch.Tensor) or tuple(saved[k].shape) != tuple(v.shape):
            got = tuple(saved[k].shape) if isinstance(saved[k], torch.Tensor) else type(saved[k]).__name__
            raise CheckpointIncomplete(f"{path}: {k} has shape {got}, the model expects {tuple(v.shape)}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(saved[k].to(v.dtype))


def load_actor(
    role_dir: str | os.PathLike,
    modules: Sequence[torch.nn.Module],
    optimizer: Any,
    use_distributed_optimizer: bool,
    load_optimizer: bool = True,
    load_rng: bool = True,
) -> str:
    """Restore this rank from the role folder of a committed step; a collective. Returns a note ('' or what
    differed)."""
    committed = CommittedRole.open(role_dir)
    role = committed.role
    place, running, grouped = running_place(use_distributed_optimizer)
    saved, records = saved_layout(committed)
    note = check_resume_layout(saved, running, str(role.parent))
    tracker, _ = committed.path(TRACKER_FILE)
    try:
        step = read_tracker(tracker)
    except TrackerError as err:
        raise CheckpointIncomplete(str(err)) from None
    if step != committed.step:
        raise CheckpointIncomplete(
            f"{tracker}: names step {step}, {role.parent / 'checkpoint.json'} step {committed.step}"
        )
    coords = (place.tp_rank, place.pp_rank, place.ep_rank)
    load_model_into(modules, committed, model_file(step, saved, grouped, coords))

    if load_optimizer and optimizer is not None:
        common = committed.load(optim_common_file(coords))
        if not isinstance(common, dict) or "stepped" not in common:
            raise CheckpointIncomplete(f"{role / optim_common_file(coords)}: not an optimizer state file of ours")
        if common["stepped"]:  # a never-stepped optimizer is what a fresh one is: nothing to load
            optimizer.load_state_dict(common["state_dict"])
            if hasattr(optimizer, "load_parameter_state") and use_distributed_optimizer:
                params, sha = committed.path(optim_params_file(coords))
                load_parameter_state(optimizer, params, sha)  # collective: DP rank 0 reads, then scatters
    if load_rng:
        same = (
            [r for r in records if r.rank == place.rank]
            if not note
            else [r for r in records if r.model_parallel_coords == coords and r.dp_rank == 0]
        )
        if len(same) != 1:
            raise CheckpointIncomplete(f"{role}: no RNG state for rank {place.rank} at {coords}")
        state = committed.load(rng_file(same[0].rank))
        if not isinstance(state, dict):
            raise CheckpointIncomplete(f"{role / rng_file(same[0].rank)}: not an RNG state file of ours")
        rng.restore(state, str(role / rng_file(same[0].rank)))
    return note
