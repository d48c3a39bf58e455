"""What each rank of the check runs: the engines, through the code the A3 job runs.

Megatron: verl's ``ActorRolloutRefWorker`` in the ``ref`` role (the same model build and checkpoint loading as
the actor's, without an optimizer's memory), brought up by our D1 translation
(`verl_patches.train_engine`), loading the converter's legacy layout through ``use_dist_checkpointing``; its
``compute_ref_log_prob`` gives the log-probs, each data-parallel rank scoring its share as verl dispatches it.

Rollout: the weight sync of the A3 job (`verl_patches.sync.sharding_manager.MegatronRolloutShardingManager`
and the patched ``per_tensor_generator``) streams the Megatron model into the rollout stand-in's vLLM-named
parameters (`verl_patches.rollout.standin`, vLLM's own DeepSeek loader), each rank serving its rollout
expert-parallel share. The stand-in computes with EP size 1 only, so rank 0 gathers every rank's experts into
one instance and scores the whole batch (with ``--rollout-ep 1`` every rank already holds every expert and
rank 0 scores with its own instance). The Megatron model is freed once synced.

Memory (`verl_patches.checks.memory`): a rank holds at most its Megatron model and its stand-in at once; the
stand-in is built on the meta device and each parameter allocated once, in the engines' dtype.

Results are written under ``out_dir`` as ``megatron_dp{d}.pt`` (by the first rank of each data-parallel
group holding the log-probs) and ``rollout.pt``.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist

from verl_patches.checkpoint.safe_load import load_tensor_file
from verl_patches.checks.rss import peak_rss_bytes
from verl_patches.checks.sequences import dp_share, response_log_probs
from verl_patches.device import accelerator_module, device_kind
from verl_patches.rollout.standin.model import StandinDeepseekV3
from verl_patches.sync.sharding_manager import MegatronRolloutShardingManager
from verl_patches.train_engine.initialize import initialize_megatron
from verl_patches.train_engine.router_buffers import FLOAT32_ROUTER_BUFFERS
from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

TEMPERATURE = 1.0


def worker_config(
    hf_dir: str,
    ckpt: str,
    tp: int,
    pp: int,
    ep: int,
    layer_list: list[int] | None,
    batch: int,
    prompt: int,
    response: int,
) -> Any:
    """The trainer config the A3 job composes (``ppo_mindspeed_trainer``), sized for the check's batch."""
    # lazy: OmegaConf is heavy and only this path needs it; importing this module stays light
    from omegaconf import open_dict

    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.trainer.config_compose import compose_config

    a = "actor_rollout_ref"
    overrides = [
        f"{a}.model.path={hf_dir}",
        f"{a}.rollout.n=1",
        f"{a}.rollout.temperature={TEMPERATURE}",
        f"{a}.rollout.prompt_length={prompt}",
        f"{a}.rollout.response_length={response}",
        f"{a}.rollout.log_prob_micro_batch_size_per_gpu=1",
        f"{a}.ref.log_prob_micro_batch_size_per_gpu=1",
        f"{a}.actor.ppo_mini_batch_size={batch}",
        f"{a}.actor.ppo_micro_batch_size_per_gpu=1",
        f"{a}.actor.use_kl_loss=False",
        f"{a}.actor.load_weight=True",
        f"{a}.ref.load_weight=True",
    ]
    cfg = compose_config("ppo_mindspeed_trainer", overrides)
    with open_dict(cfg):
        for role in ("actor", "ref"):
            m = cfg.actor_rollout_ref[role].megatron
            m.tensor_model_parallel_size, m.pipeline_model_parallel_size = tp, pp
            m.expert_model_parallel_size = ep
            m.use_dist_checkpointing, m.dist_checkpointing_path = True, ckpt
        cfg.actor_rollout_ref.actor.megatron.pipeline_parallel_num_layer_list = layer_list
        cfg.actor_rollout_ref.actor.megatron.sequence_parallel = tp > 1
    return cfg


def _proto(batch: dict[str, torch.Tensor]) -> Any:
    # deferred: a rank imports this module before the overlay is active; verl loads after it
    from verl import DataProto

    return DataProto.from_dict(tensors=dict(batch))


def _standin(cfg_hf: dict, dtype: torch.dtype, ep_size: int, ep_rank: int) -> Any:
    # lazy: transformers is heavy and only this path needs it; importing this module stays light
    from transformers import DeepseekV3Config

    hf_config = DeepseekV3Config(**cfg_hf)
    hf_config._attn_implementation = "eager"
    # Built on the meta device, then each vLLM-named parameter allocated once: constructed on the CPU, the
    # stand-in would first build transformers' whole model in float32 with its random initialisation and
    # then copy it (three copies of the slice next to the Megatron model). Every parameter is overwritten by
    # the weight sync, so no initial value is needed.
    # (transformers' init_empty_weights moves each parameter to meta as it is registered; a torch.device("meta")
    # context was measured to have no effect in a rank: the model was still built on the CPU)
    from transformers.modeling_utils import init_empty_weights

    with init_empty_weights(include_buffers=False):
        standin = StandinDeepseekV3(hf_config, dtype=dtype, ep_size=ep_size, ep_rank=ep_rank, device="meta")
    for name, meta in list(standin.named_parameters()):
        param = torch.nn.Parameter(torch.zeros(meta.shape, dtype=meta.dtype), requires_grad=False)
        param.weight_loader = meta.weight_loader
        module, _, leaf = name.rpartition(".")
        standin.get_submodule(module).register_parameter(leaf, param)
    rotary = standin.hf.model.rotary_emb  # its inv_freq is computed from the config, not loaded
    standin.hf.model.rotary_emb = type(rotary)(config=hf_config)
    leftover = [n for n, t in [*standin.named_parameters(), *standin.hf.named_buffers()] if t.is_meta]
    if leftover:
        raise RuntimeError(f"rollout stand-in: tensors left on the meta device: {leftover[:5]}")
    standin.bind_views()
    return standin


def _sync_into_standin(ref: Any, standin: Any, rollout_tp: int) -> int:
    """Run the A3 job's sharding manager once (train -> rollout); returns the number of parameters loaded."""
    # deferred: a rank imports this module before the overlay is active; vLLM loads after it
    from vllm.distributed import parallel_state as vllm_ps

    rollout = SimpleNamespace(
        model=standin,
        onload_model_weights=lambda: None,
        free_cache_engine=lambda: None,
        offload_model_weights=lambda: None,
    )
    manager = MegatronRolloutShardingManager(
        ref.ref_module,
        model_config=ref.ref_model_config,
        transformer_config=ref.tf_config,
        layer_name_mapping=None,
        weight_converter=None,
        rollout=rollout,
        prepare_model=lambda m: None,
        empty_cache=lambda: None,
        infer_tp=(rollout_tp, 0, None),
    )
    # no vLLM engine is started by the check, so vLLM's parallel state has no TP group: the sync reads the
    # rollout TP size from it, so it is given the check's --rollout-tp for the duration of the sync
    with mock.patch.object(vllm_ps, "get_tensor_model_parallel_world_size", lambda: rollout_tp):
        with manager:
            pass
    return int(manager.loaded_params)


def _gathered_rollout_log_probs(
    standin: Any, cfg_hf: dict, dtype: torch.dtype, batch: dict[str, torch.Tensor], rank: int, world: int
) -> torch.Tensor | None:
    """Rank 0: one EP-1 instance holding every rank's synced experts (the other weights are identical on every
    rank after the sync), scoring ``batch``."""

    if standin.ep_size == 1:  # every rank serves every expert: rank 0 scores with its own instance
        if rank != 0:
            return None
        whole = standin
    else:
        experts = {
            "experts": list(standin.experts),
            "params": {n: p.detach() for n, p in standin.named_parameters() if ".mlp.experts.w" in n},
        }
        gathered: list[Any] = [None] * world if rank == 0 else []
        dist.gather_object(experts, gathered if rank == 0 else None, dst=0)
        if rank != 0:
            return None
        whole = _standin(cfg_hf, dtype, ep_size=1, ep_rank=0)
        local = dict(standin.named_parameters())
        with torch.no_grad():
            for name, p in whole.named_parameters():
                if ".mlp.experts.w" in name:
                    for g in gathered:
                        for i, e in enumerate(g["experts"]):
                            p.data[e].copy_(g["params"][name][i])
                else:
                    p.data.copy_(local[name].data)
        del gathered, local
    with torch.no_grad():
        whole.bind_views()
        whole.process_weights_after_loading()
        logits = whole(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits
    return response_log_probs(logits, batch["responses"], TEMPERATURE)


def _router_buffers_not_float32(chunks: Any) -> list[str]:
    """Router buffers the job's model build left below float32 (it must keep them float32: see
    verl_patches.train_engine.router_buffers); the check refuses to score such a model."""

    return [
        f"{name}.{buf}"
        for chunk in chunks
        for name, mod in chunk.named_modules()
        for buf in FLOAT32_ROUTER_BUFFERS
        if isinstance(mod._buffers.get(buf), torch.Tensor) and mod._buffers[buf].dtype != torch.float32
    ]


def prepare_rank(rank: int, world: int) -> None:
    """Before the rank's process group (`verl_patches.multirank` calls it): on an accelerator host the rank's own
    device, which HCCL binds at the group's creation; on a CPU host its share of the cores."""
    if device_kind() == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    else:
        accelerator_module().set_device(rank)


def rank_check(
    rank: int,
    world: int,
    *,
    hf_dir: str,
    mcore_dir: str,
    tp: int,
    pp: int,
    ep: int,
    layer_list: list[int] | None,
    engines: list[str],
    rollout_tp: int,
    rollout_ep: int,
    batch_file: str,
    out_dir: str,
    dtype: str,
) -> dict[str, Any]:
    # deferred: a rank imports this module before the overlay is active; Megatron loads after it
    from megatron.core import parallel_state as mpu

    # deferred: a rank imports this module before the overlay is active; verl loads after it
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    # lazy: that module loads safetensors, tqdm; importing this one must not
    from verl_patches.patches.verl.workers.megatron_workers import trainer_config_view

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]

    batch = load_tensor_file(batch_file)  # weights-only: the batch is a dict of tensors
    n, r = batch["responses"].shape[0], batch["responses"].shape[1]
    cfg_hf = json.loads((Path(hf_dir) / "config.json").read_text())
    cfg = worker_config(hf_dir, mcore_dir, tp, pp, ep, layer_list, n, batch["input_ids"].shape[1] - r, r)
    args = initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(cfg.actor_rollout_ref)))
    if torch_dtype == torch.float32:
        # MindSpeed-LLM's argument check refuses grouped GEMM without --bf16: fp32 parameters are set after it
        args.bf16, args.params_dtype = False, torch.float32
    os.environ["VLLM_DP_SIZE"] = str(rollout_ep // rollout_tp)

    ref = ActorRolloutRefWorker(cfg.actor_rollout_ref, "ref")
    ref.init_model()
    low = _router_buffers_not_float32(ref.ref_module)
    if low:
        raise RuntimeError(
            f"rank {rank}: the Megatron model build left router buffers below float32: {low[:4]}; "
            "the weight sync and the routing expect float32 (router_buffers.keep_router_buffers_float32)"
        )
    dp, dp_rank = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    out: dict[str, Any] = {"dp": dp, "dp_rank": dp_rank}
    if "megatron" in engines:
        mine = dp_share(batch, dp, dp_rank)
        lp = ref.compute_ref_log_prob(_proto(mine)).batch["ref_log_prob"]
        first_of_dp = (
            mpu.get_tensor_model_parallel_rank() == 0
            and mpu.get_pipeline_model_parallel_rank() == 0
            and mpu.get_context_parallel_rank() == 0
        )
        if first_of_dp:
            torch.save(lp.float(), os.path.join(out_dir, f"megatron_dp{dp_rank}.pt"))
    if "rollout" in engines:
        standin = _standin(cfg_hf, torch_dtype, ep_size=rollout_ep, ep_rank=rank % rollout_ep)
        out["rollout_loaded_params"] = _sync_into_standin(ref, standin, rollout_tp)
        out["rollout_experts"] = list(standin.experts)
        # the training model is no longer needed: free it before rank 0 builds the whole rollout instance
        del ref
        gc.collect()
        lp = _gathered_rollout_log_probs(standin, cfg_hf, torch_dtype, batch, rank, world)
        if lp is not None:
            torch.save(lp.float(), os.path.join(out_dir, "rollout.pt"))
    # the rank's peaks are short (inside the sync): the kernel's high-water mark holds them exactly
    out["peak_rss"] = peak_rss_bytes(os.getpid())
    return out
