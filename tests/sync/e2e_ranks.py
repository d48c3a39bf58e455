"""Rank side of the end-to-end sync test: verl's Megatron actor (MindSpeed-LLM DeepSeek-V3 on CPU) → the
CPU rollout stand-in, through the patched ``per_tensor_generator`` and the E1 sharding manager.

Training TP2·PP2·EP2 with the uneven layer list [2, 3] (every stage has a MoE layer: with [1, 2] stage 0 has no
expert parameters and the distributed optimizer's grad-norm all-reduce of update_actor hangs, an engine issue)
and 8 routed experts (8 ranks); rollout TP2 with
``VLLM_DP_SIZE=4``: one instance, EP8, one expert per rank (the A3 random-init layout scaled down). The
model is fp32 (as the engine's golden test runs it) so log-probs compare at 1e-4.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

# the engine golden test's model (golden_assets.HF_OVERRIDES) with five layers
HF_OVERRIDES = dict(
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=5,
    first_k_dense_replace=1,
    n_routed_experts=8,
    n_group=1,
    topk_group=1,
    num_experts_per_tok=2,
    n_shared_experts=1,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=256,
)
TP, PP, EP, LAYER_LIST, ROLLOUT_TP, VLLM_DP = 2, 2, 2, [2, 3], 2, 4


def build_hf(root: Path) -> Path:
    """The engine golden test's tiny model (8 routed experts) with `HF_OVERRIDES`' five layers."""
    from tests.megatron_engine import golden_assets as ga

    saved = dict(ga.HF_OVERRIDES)
    ga.HF_OVERRIDES.clear()
    ga.HF_OVERRIDES.update(HF_OVERRIDES)
    try:
        return ga.build_hf_model(root)
    finally:
        ga.HF_OVERRIDES.clear()
        ga.HF_OVERRIDES.update(saved)


def _proto(batch, **meta):
    from verl import DataProto

    return DataProto.from_dict(tensors=dict(batch), meta_info=dict(meta))


def _standin(cfg: dict, ep_size: int, ep_rank: int):
    from transformers import DeepseekV3Config

    from verl_patches.rollout.standin.model import StandinDeepseekV3

    hf_config = DeepseekV3Config(**cfg)
    hf_config._attn_implementation = "eager"
    return StandinDeepseekV3(hf_config, dtype=torch.float32, ep_size=ep_size, ep_rank=ep_rank)


def _rollout_log_probs(model, batch, temperature: float, response: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        ).logits.float()
    logits = logits[:, -response - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch["responses"][..., None])[..., 0]


def rank_e2e(rank: int, world: int, hf: str, ckpt: str) -> dict:
    import json
    import os

    import torch.distributed as dist
    from megatron.core import parallel_state as mpu
    from verl.workers.megatron_workers import ActorRolloutRefWorker
    from vllm.distributed import parallel_state as vllm_ps

    from tests.megatron_engine import golden_assets as ga
    from verl_patches.patches.verl.workers.megatron_workers import trainer_config_view
    from verl_patches.sync.sharding_manager import MegatronRolloutShardingManager
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    hf_dir = Path(hf)
    cfg_hf = json.loads((hf_dir / "config.json").read_text())
    cfg = ga.worker_config(hf_dir, Path(ckpt), TP, PP, EP, LAYER_LIST)
    args = initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(cfg.actor_rollout_ref)))
    args.bf16, args.params_dtype = False, torch.float32
    # the rollout's parallel state (vLLM is not started on CPU): rollout TP2, VLLM_DP_SIZE instances of EP
    os.environ["VLLM_DP_SIZE"] = str(VLLM_DP)
    vllm_ps.get_tensor_model_parallel_world_size = lambda: ROLLOUT_TP

    full = ga.make_batch(cfg_hf["vocab_size"])
    dp, d = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    n = ga.BATCH // dp
    mine = {k: v[d * n : (d + 1) * n] for k, v in full.items()}
    inputs = {k: v for k, v in mine.items() if k != "advantages"}

    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")
    actor.init_model()
    actor.config.actor.recompute_old_log_prob = True

    standin = _standin(cfg_hf, ep_size=ROLLOUT_TP * VLLM_DP, ep_rank=rank)
    log = []
    rollout = SimpleNamespace(
        model=standin,
        onload_model_weights=lambda: log.append("onload"),
        free_cache_engine=lambda: log.append("free"),
        offload_model_weights=lambda: log.append("offload"),
    )
    import verl.utils.megatron_utils as mu

    out: dict = {"per_tensor_generator": f"{mu.per_tensor_generator.__module__}.{mu.per_tensor_generator.__name__}"}
    manager = MegatronRolloutShardingManager(
        actor.actor.actor_module,
        model_config=actor.actor_model_config,
        transformer_config=actor.tf_config,
        layer_name_mapping=None,
        weight_converter=None,
        rollout=rollout,
        prepare_model=lambda m: None,
        empty_cache=lambda: None,
        infer_tp=(1, 0, None),
    )

    def step(tag: str) -> torch.Tensor:
        lp = actor.compute_log_prob(_proto(inputs)).batch["old_log_probs"]
        with manager:
            pass
        # the rollout instance computes with every expert: gather each rank's EP-local experts
        local = {n: p.detach().clone() for n, p in standin.named_parameters()}
        gathered = [None] * world
        dist.all_gather_object(
            gathered,
            {
                "rank": rank,
                "experts": standin.experts,
                "params": {k: v for k, v in local.items() if ".mlp.experts.w" in k},
            },
        )
        whole = _standin(cfg_hf, ep_size=1, ep_rank=0)
        with torch.no_grad():
            for name, p in whole.named_parameters():
                if ".mlp.experts.w" in name:
                    for g in gathered:
                        for i, e in enumerate(g["experts"]):
                            p.data[e].copy_(g["params"][name][i])
                else:
                    p.data.copy_(local[name])
        whole.bind_views()
        whole.process_weights_after_loading()
        rollout_lp = _rollout_log_probs(whole, mine, ga.TEMPERATURE, ga.RESPONSE)
        mask = mine["attention_mask"][:, -ga.RESPONSE :].bool()
        out[f"{tag}_diff"] = float((lp - rollout_lp)[mask].abs().max())
        out[f"{tag}_loaded"] = manager.loaded_params
        out[f"{tag}_experts"] = list(standin.experts)
        return rollout_lp

    before = step("before")
    actor.config.actor.recompute_old_log_prob = False
    actor.update_actor(_proto(mine, global_token_num=[int(mine["attention_mask"].sum())]))
    actor.config.actor.recompute_old_log_prob = True
    after = step("after")
    out["update_changed_rollout"] = float((before - after).abs().max())
    out["lifecycle"] = log
    return out
