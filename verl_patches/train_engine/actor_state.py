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

A save is two halves (issue 42): `snapshot_actor` takes, where the save is called, everything the files will hold
(`ActorSnapshot`), and `write_actor` writes them, in the foreground (`save_actor`) or in a background thread
(`verl_patches.checkpoint.background_write`). The snapshot copies as little as it can: weights offloaded to the
host (``param_offload``) are read from the host buffer verl keeps them in (``cpu_data`` of each DDP buffer: verl's
offload replaces it, never writes into it), weights on the device are copied to the host; the optimizer's state
is `optimizer_state.parameter_state_for_save`'s (the DP gather where a DP group has several ranks, views of the
swap optimizer's host buffers where it is this rank alone); the RNG states are copied. What is a view of live
state must not change until the write is done: the fence before the next update (`background_write`).

Every file is recorded with its sha256, hashed by the rank that wrote it. Loading reads the same files back
from a committed step only: each through `safe_load.load_tensor_file` (weights only, never unpickling code),
after its sha256 is checked against the step manifest (a changed file is refused by name, unread), and by
a name confined to the step folder. A layout that differs in more than the DP size is refused before
anything is read (`manifest.check_resume_layout`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verl_patches.base.atomic_write import write_atomically, write_json_atomically, write_text_atomically
from verl_patches.checkpoint import rng
from verl_patches.checkpoint.committed_role import CommittedRole, saved_layout
from verl_patches.checkpoint.manifest import (
    CheckpointIncomplete,
    RankRecord,
    TrainLayout,
    check_resume_layout,
    rank_record_name,
)
from verl_patches.checkpoint.optimizer_state import load_parameter_state, parameter_state_for_save
from verl_patches.checkpoint.safe_load import sha256_file
from verl_patches.checkpoint.tracker import TrackerError, read_tracker
from verl_patches.weights.hf_to_mcore import CKPT_FILE, TRACKER_FILE, iteration_dir
from verl_patches.weights.hf_to_mcore import MANIFEST_FILE as CONVERTER_MANIFEST
from verl_patches.weights.layout import ParallelLayout, Rank, rank_dir_name

OPTIM_DIR = "optim"
RNG_DIR = "rng"
# upstream code the snapshot relies on -> its fingerprint (a test compares them with the tree): verl's offload
# copies each DDP buffer to a new host tensor (``cpu_data``) and frees the device storage, its load copies from
# that tensor, never into it; so a view of ``cpu_data`` keeps its values while a background write reads it
RELIED_ON = {
    "verl.utils.megatron_utils:offload_megatron_model_to_cpu": "sha256:fb463348854df7b0",
    "verl.utils.megatron_utils:load_megatron_model_to_gpu": "sha256:afceb3256d2c3f81",
}


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
    """The model shard to save, on the host: a parameter offloaded by verl (its DDP buffer's storage freed, the
    values in the buffer's ``cpu_data``) is a view of that host buffer, not a copy; anything on the device is
    copied to the host; a host tensor is kept as it is."""
    if len(modules) != 1:
        raise NotImplementedError(
            "virtual pipeline stages are not supported by the actor checkpoint "
            f"({len(modules)} model chunks on this rank)"
        )
    offloaded = _offloaded_views(modules[0])
    out = {}
    for k, v in _unwrap(modules[0]).state_dict(keep_vars=True).items():
        if k.endswith("_extra_state") or not isinstance(v, torch.Tensor):
            continue
        out[k] = offloaded[id(v)] if id(v) in offloaded else v.detach().cpu()
    return out


def _offloaded_views(module: torch.nn.Module) -> dict[int, torch.Tensor]:
    """id(parameter) -> its values in the host copy verl's ``offload_megatron_model_to_cpu`` made of its DDP
    buffer, for the buffers whose device storage is freed (offloaded); empty when nothing is offloaded."""
    out: dict[int, torch.Tensor] = {}
    for buffer in [
        *(getattr(module, "buffers", None) or []),
        *(getattr(module, "expert_parallel_buffers", None) or []),
    ]:
        data = getattr(buffer, "param_data", None)
        host = getattr(data, "cpu_data", None) if data is not None else None
        if host is None or data.untyped_storage().size() != 0:
            continue  # on the device (or never offloaded): state_dict() reads it
        for param, (start, end, _bucket) in buffer.param_index_map.items():
            out[id(param)] = host[start:end].view(param.shape)
    return out


def optimizer_has_stepped(optimizer: Any) -> bool:
    """Whether Adam holds moments yet (Megatron's DP gather of the state needs them)."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is not None and len(getattr(inner, "state", {})) > 0:
            return True
    return False


@dataclass
class FileToWrite:
    """One file of a rank's save: ``torch.save`` of ``obj`` (``kind`` "pt"), JSON or text."""

    rel: str
    obj: Any
    kind: str = "pt"


@dataclass
class ActorSnapshot:
    """Everything one rank's part of an actor checkpoint will hold, taken where the save was called."""

    role: Path
    step: int
    place: RankPlace
    layout: TrainLayout
    files: list[FileToWrite] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors the snapshot holds (views counted at their size)."""
        return sum(_tensor_bytes(f.obj) for f in self.files)

    def owned(self) -> ActorSnapshot:
        """The same snapshot holding copies of its tensors: for a caller that frees or changes the state the views
        read before the write ends (a host copy of the state, as Megatron's own asynchronous save makes)."""
        files = [FileToWrite(f.rel, _copied(f.obj), f.kind) for f in self.files]
        return ActorSnapshot(self.role, self.step, self.place, self.layout, files)


def _tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def _on_host(obj: Any) -> Any:
    """``obj`` with every device tensor copied to the host (host tensors, and everything else, as they are)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu() if obj.device.type != "cpu" else obj.detach()
    if isinstance(obj, dict):
        return {k: _on_host(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_on_host(v) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_on_host(v) for v in obj)
    return obj


def _copied(obj: Any) -> Any:
    """A deep copy of the tensors in ``obj`` on the host (small states whose owners may change them in place)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().clone()
    if isinstance(obj, dict):
        return {k: _copied(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_copied(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_copied(v) for v in obj)
    return obj


def snapshot_actor(
    role_dir: str | os.PathLike,
    step: int,
    modules: Sequence[torch.nn.Module],
    optimizer: Any,
    hf_config: Mapping[str, Any] | None,
    use_distributed_optimizer: bool,
) -> ActorSnapshot:
    """This rank's part of the actor checkpoint of ``step``, ready to be written (`write_actor`); a collective
    over all actor ranks (the optimizer's DP gather)."""
    role = Path(role_dir)
    place, layout, grouped = running_place(use_distributed_optimizer)
    coords = (place.tp_rank, place.pp_rank, place.ep_rank)
    writer = place.expert_dp_rank == 0  # one writer per (tp, pp, ep)
    snap = ActorSnapshot(role, int(step), place, layout)

    if writer:
        snap.files.append(
            FileToWrite(
                model_file(step, layout, grouped, coords),
                {"model": model_state(modules), "iteration": step, "checkpoint_version": 3.0},
            )
        )
    if optimizer is not None:
        stepped = optimizer_has_stepped(optimizer)  # the same on every rank: they step together
        if stepped and hasattr(optimizer, "save_parameter_state") and use_distributed_optimizer:
            states = parameter_state_for_save(optimizer)  # collective: every rank joins the DP gather
            if states is not None:
                snap.files.append(FileToWrite(optim_params_file(coords), states))
        if writer:
            snap.files.append(
                FileToWrite(
                    optim_common_file(coords),
                    {"stepped": stepped, "state_dict": _on_host(optimizer.state_dict()) if stepped else None},
                )
            )
    snap.files.append(FileToWrite(rng_file(place.rank), _copied(rng.capture())))

    if place.rank == 0:  # our converter's files: the export tool and C1's loader read this folder as is
        snap.files.append(
            FileToWrite(
                CONVERTER_MANIFEST,
                {
                    "tool": "verl_patches.checkpoint",
                    "complete": True,
                    "layout": converter_layout(layout, grouped).to_json(),
                    "hf_config": dict(hf_config) if hf_config is not None else None,
                    "iteration": step,
                },
                "json",
            )
        )
        snap.files.append(FileToWrite(TRACKER_FILE, str(step), "text"))
    return snap


# the writer reports each file: (path, True once it is complete); `background_write.Progress`
WriteProgress = Callable[[Path, bool], None]


def write_actor(snap: ActorSnapshot, progress: WriteProgress | None = None) -> RankRecord:
    """Write ``snap``'s files (each atomically, hashed where it was written, so the driver never reads the
    large files again), then this rank's record, last: without it the driver refuses to commit the step."""
    sizes: dict[str, int] = {}
    digests: dict[str, str] = {}
    for f in snap.files:
        path = snap.role / f.rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if progress is not None:
            progress(path, False)
        if f.kind == "json":
            write_json_atomically(path, f.obj)
        elif f.kind == "text":
            write_text_atomically(path, f.obj)
        else:
            write_atomically(path, lambda p, obj=f.obj: torch.save(obj, p))
        sizes[f.rel], digests[f.rel] = path.stat().st_size, sha256_file(path)
        if progress is not None:
            progress(path, True)
    place = snap.place
    record = RankRecord(
        rank=place.rank,
        layout=snap.layout,
        tp_rank=place.tp_rank,
        pp_rank=place.pp_rank,
        ep_rank=place.ep_rank,
        dp_rank=place.dp_rank,
        files=sizes,
        sha256=digests,
    )
    write_json_atomically(snap.role / rank_record_name(place.rank), record.to_json())
    return record


def save_actor(
    role_dir: str | os.PathLike,
    step: int,
    modules: Sequence[torch.nn.Module],
    optimizer: Any,
    hf_config: Mapping[str, Any] | None,
    use_distributed_optimizer: bool,
) -> RankRecord:
    """This rank's part of the actor checkpoint of ``step``, written before it returns; a collective over all
    actor ranks."""
    return write_actor(snapshot_actor(role_dir, step, modules, optimizer, hf_config, use_distributed_optimizer))


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
