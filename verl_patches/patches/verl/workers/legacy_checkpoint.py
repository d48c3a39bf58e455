"""C1: load the actor's and reference's weights from the legacy Megatron checkpoint our converter writes.

verl v0.4.0 reads ``use_dist_checkpointing`` weights with ``load_mcore_dist_weights`` (Megatron's
distributed-checkpoint format). ``verl_patches/scripts/convert_ckpt_deepseek3.py`` writes what MindSpeed-LLM
loads instead: ``latest_checkpointed_iteration.txt`` + ``iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``
plus a manifest recording the layout it was cut for. Each rank reads exactly its own file.

Planning (which file, whether the running layout matches the checkpoint's) is pure; loading is a strict
``load_state_dict`` into the unwrapped model, so a missing, extra or misshapen tensor is an error that names
the file and the parameter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from verl_patches.weights.errors import CheckpointError, LayoutError
from verl_patches.weights.hf_to_mcore import load_manifest, rank_file
from verl_patches.weights.layout import ParallelLayout, Rank
from verl_patches.weights.mcore_to_hf import expected_rank_digest, load_rank_file, read_tracker, recorded_rank_digests


@dataclass(frozen=True)
class RunningLayout:
    """This process's place in the running Megatron layout."""

    tp: int
    pp: int
    ep: int
    tp_rank: int
    pp_rank: int
    ep_rank: int
    num_layer_list: tuple[int, ...] | None = None
    moe_tp_extend_ep: bool = False


def plan_rank_file(ckpt_dir: Path, running: RunningLayout) -> Path:
    """The rank file this process loads, after checking the checkpoint was cut for the running layout."""
    manifest = load_manifest(ckpt_dir)
    if manifest is None:
        raise CheckpointError(
            f"{ckpt_dir}: no conversion manifest; convert the HF weights with "
            "verl_patches/scripts/convert_ckpt_deepseek3.py (it records the layout)"
        )
    if not manifest.get("complete", False):
        raise CheckpointError(f"{ckpt_dir}: the conversion did not finish; re-run the same convert command")
    layout = ParallelLayout.from_json(manifest["layout"])
    want = ParallelLayout(
        tp=running.tp,
        pp=running.pp,
        ep=running.ep,
        num_layer_list=running.num_layer_list,
        moe_grouped_gemm=layout.moe_grouped_gemm,
        moe_tp_extend_ep=running.moe_tp_extend_ep,
    )
    diffs = [
        f"{k}: checkpoint {getattr(layout, k)!r}, running {getattr(want, k)!r}"
        for k in ("tp", "pp", "ep", "moe_tp_extend_ep")
        if getattr(layout, k) != getattr(want, k)
    ]
    if running.pp > 1 and (layout.num_layer_list or None) != (want.num_layer_list or None):
        diffs.append(f"num_layer_list: checkpoint {layout.num_layer_list!r}, running {want.num_layer_list!r}")
    if diffs:
        raise LayoutError(
            f"{ckpt_dir}: the checkpoint was converted for another layout ({'; '.join(diffs)}); "
            "convert again with the running layout (actor.megatron.* sizes and "
            "pipeline_parallel_num_layer_list)"
        )
    return rank_file(ckpt_dir, layout, Rank(running.tp_rank, running.pp_rank, running.ep_rank), read_tracker(ckpt_dir))


def running_layout() -> RunningLayout:
    """The running layout from Megatron's parallel state and global arguments."""
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.core import parallel_state as mpu
    from megatron.training import get_args

    args = get_args()
    nll = getattr(args, "num_layer_list", None)
    if isinstance(nll, str):
        nll = tuple(int(x) for x in nll.split(","))
    return RunningLayout(
        tp=mpu.get_tensor_model_parallel_world_size(),
        pp=mpu.get_pipeline_model_parallel_world_size(),
        ep=mpu.get_expert_model_parallel_world_size(),
        tp_rank=mpu.get_tensor_model_parallel_rank(),
        pp_rank=mpu.get_pipeline_model_parallel_rank(),
        ep_rank=mpu.get_expert_model_parallel_rank(),
        num_layer_list=tuple(nll) if nll else None,
        moe_tp_extend_ep=bool(getattr(args, "moe_tp_extend_ep", False)),
    )


def load_into(module: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Strict, shape-checked copy of ``state`` into ``module``; errors name ``where`` and the parameters."""
    own = {k: v for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    missing = sorted(set(own) - set(state))
    extra = sorted(set(state) - set(own))
    if missing or extra:
        raise CheckpointError(
            f"{where}: parameters do not match the model built here: "
            f"missing {missing[:5]}{'...' if len(missing) > 5 else ''}, "
            f"unexpected {extra[:5]}{'...' if len(extra) > 5 else ''}"
        )
    for k, v in own.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise CheckpointError(f"{where}: {k} has shape {tuple(state[k].shape)}, the model expects {tuple(v.shape)}")
    with torch.no_grad():
        for k, v in own.items():
            v.copy_(state[k].to(v.dtype))


def load_legacy_weights(
    parallel_model: Sequence[torch.nn.Module], dist_weight_path: str, is_value_model: bool = False
) -> None:
    """Drop-in for ``verl.utils.model.load_mcore_dist_weights`` reading our converter's legacy layout."""
    # deferred: a patch applies while upstream is still importing; verl is read at call time
    from verl.utils.megatron_utils import unwrap_model

    if is_value_model:
        raise NotImplementedError("loading a value model from a legacy DeepSeek-V3 checkpoint is not supported")
    if len(parallel_model) != 1:
        raise NotImplementedError("virtual pipeline stages are not supported by the legacy checkpoint loader")
    ckpt_dir = Path(dist_weight_path)
    path = plan_rank_file(ckpt_dir, running_layout())
    # the converter's manifest records each rank file's sha256: a changed file is refused before it is read
    digest = expected_rank_digest(recorded_rank_digests(ckpt_dir, read_tracker(ckpt_dir)), path.parent.name, path)
    state, _ = load_rank_file(path, digest)
    load_into(unwrap_model(parallel_model[0]), state, path)
