"""Golden test of the A3 training engine on CPU: verl's Megatron ``ActorRolloutRefWorker`` (actor and
reference) on core_r0.8.0 + MindSpeed-LLM + MindSpeed over gloo, against HF transformers' DeepseekV3.

A tiny DeepSeek-V3 (random init, MLA, 1 dense + 2 MoE layers, 4 routed experts, a shared expert, a non-zero
routing bias; 8 routed experts so each of the 4 TP x EP ranks holds two: with one local expert
MindSpeed's overlapped dispatcher frees the expert input it hands on, on NPU too) is saved by transformers,
converted by our converter to the legacy layout, and loaded by the worker's own loading code
(``use_dist_checkpointing``). Through the worker methods the A3 job calls
(``init_model``, ``compute_log_prob``, ``compute_ref_log_prob``, ``update_actor``; called directly, each rank
given its data-parallel share as verl's MEGATRON_COMPUTE_PROTO dispatch would), at the A3 profile's sampling
temperature 0.9:

- TP2 x EP2 (4 ranks, TP-extend-EP, sequence parallel): per-token log-probs of actor and reference equal HF's
  within 1e-4 in fp32; the routed experts' gradients of one MoE layer equal HF autograd's within 1e-4; one
  ``update_actor`` step with the distributed optimizer changes the weights; in bf16 (A3's dtype) the
  log-probs agree with HF's fp32 ones within BF16_TOL / BF16_MEAN_TOL and the expert gradients point the
  same way (cosine > BF16_GRAD_COS).
- PP2 with the uneven layer list [1, 2] (2 ranks): log-probs of actor and reference within 1e-4.

fp32: MindSpeed-LLM's argument check refuses grouped GEMM without --bf16, so the fp32 runs set
``params_dtype`` to fp32 after the arguments are validated (the model, the HF reference and the comparison
are then all fp32); bf16 runs use the arguments as the A3 job does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from golden_assets import (
    BATCH,
    RESPONSE,
    TEMPERATURE,
    build_hf_model,
    convert,
    expert_grads_as_rank,
    hf_log_probs,
    make_batch,
    worker_config,
)
from verl_patches.multirank import run_ranks

FP32_TOL = 1e-4
# bf16 weights and activations against HF's fp32 log-probs. bf16 keeps 8 significant bits (relative rounding
# 2^-9 ~ 2e-3 per value); the weights alone move each logit by about that fraction of its size, and the error
# grows through 3 layers, the routing (a near-tie between experts can flip) and a 44-way log-softmax.
# Measured here: worst token 0.09, mean 0.012 (log-probs around -3.8). The bounds leave about 1.5x and 2.5x room.
BF16_TOL = 0.15
BF16_MEAN_TOL = 0.03
# bf16 expert gradients against HF's fp32 autograd, per rank's experts, as cosine similarity: a rank whose
# experts see few tokens moves a lot when bf16 rounding flips one token's routing (measured: cosine 0.956 to
# 0.99994, max error 0.5% to 52% of that rank's largest gradient).
BF16_GRAD_COS = 0.9
MOE_LAYER = 1  # the first MoE layer (layer 0 is dense)

pytestmark = [pytest.mark.multiproc, pytest.mark.slow, pytest.mark.needs_components("mindspeed", "mindspeed_llm")]


@pytest.fixture(scope="module")
def assets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("golden")
    hf = build_hf_model(root)
    return {
        "hf": str(hf),
        "tp2ep2": str(convert(hf, root / "tp2ep2", tp=2, pp=1, ep=2, num_layer_list=None)),
        "pp2": str(convert(hf, root / "pp2", tp=1, pp=2, ep=1, num_layer_list=(1, 2))),
    }


def _bring_up(cfg, fp32: bool) -> None:
    """What the worker's ``__init__`` does (D1 through the train engine), with fp32 parameters if asked."""
    from verl_patches.patches.verl.workers.megatron_workers import trainer_config_view
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    args = initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(cfg.actor_rollout_ref)))
    if fp32:
        args.bf16, args.params_dtype = False, torch.float32


def _dp_share(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    from megatron.core import parallel_state as mpu

    dp, r = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    n = BATCH // dp
    return {k: v[r * n : (r + 1) * n] for k, v in batch.items()}


def _proto(batch: dict[str, torch.Tensor], **meta):
    from verl import DataProto

    return DataProto.from_dict(tensors=dict(batch), meta_info=dict(meta))


def rank_golden(
    rank: int, world: int, hf: str, ckpt: str, tp: int, pp: int, ep: int, layer_list, grads: bool, bf16: bool
) -> dict:
    from megatron.core import parallel_state as mpu
    from verl.utils.megatron_utils import unwrap_model
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    hf_dir = Path(hf)
    cfg = worker_config(hf_dir, Path(ckpt), tp, pp, ep, layer_list)
    _bring_up(cfg, fp32=True)
    vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
    full = make_batch(vocab)
    mine = _dp_share(full)
    ref_lp, _ = hf_log_probs(hf_dir, full, TEMPERATURE)
    ref_lp = _dp_share({"lp": ref_lp})["lp"]
    mask = mine["attention_mask"][:, -RESPONSE:].bool()
    out: dict = {"dp": mpu.get_data_parallel_world_size()}
    inputs = {k: v for k, v in mine.items() if k != "advantages"}

    actor = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")
    actor.init_model()
    actor.config.actor.recompute_old_log_prob = True  # the A3 profile skips it; here it is the thing measured
    lp = actor.compute_log_prob(_proto(inputs)).batch["old_log_probs"]
    out["actor"] = float((lp - ref_lp)[mask].abs().max())

    ref = ActorRolloutRefWorker(cfg.actor_rollout_ref, "ref")
    ref.init_model()
    rlp = ref.compute_ref_log_prob(_proto(inputs)).batch["ref_log_prob"]
    out["ref"] = float((rlp - ref_lp)[mask].abs().max())
    del ref

    if grads:
        # the gradients the actor's update computes (its own loss path), before the optimizer touches them
        a = actor.actor
        a.config.recompute_old_log_prob = False
        for chunk in a.actor_module:
            chunk.zero_grad_buffer()
        a.forward_backward_batch(_proto(mine, temperature=TEMPERATURE), micro_batch_size=1, mini_batch_size=BATCH)
        params = dict(unwrap_model(a.actor_module[0]).named_parameters())
        lp_hf, model = hf_log_probs(hf_dir, full, TEMPERATURE, grad=True)
        rm = full["attention_mask"][:, -RESPONSE:].float()
        adv = full["advantages"]
        # verl's loss per rank: token-mean per micro-batch (one sequence), averaged over micro-batches and DP
        loss = sum((-adv[i] * lp_hf[i] * rm[i]).sum() / rm[i].sum() for i in range(BATCH)) / BATCH
        loss.backward()
        hf_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        cfg_hf = json.loads((hf_dir / "config.json").read_text())
        want = expert_grads_as_rank(
            hf_grads,
            cfg_hf,
            MOE_LAYER,
            tp,
            pp,
            ep,
            (
                mpu.get_tensor_model_parallel_rank(),
                mpu.get_pipeline_model_parallel_rank(),
                mpu.get_expert_model_parallel_rank(),
            ),
        )
        out["grad_scale"] = float(want["weight1"].abs().max())
        for w in ("weight1", "weight2"):
            got = params[f"decoder.layers.{MOE_LAYER}.mlp.experts.{w}"].main_grad
            out[f"grad_{w}"] = (
                float((got.view(-1) - want[w].reshape(-1)).abs().max())
                if got.numel() == want[w].numel()
                else f"shape {tuple(got.shape)} vs {tuple(want[w].shape)}"
            )

        before = {n: p.detach().clone() for n, p in params.items()}
        actor.config.actor.recompute_old_log_prob = False
        metrics = actor.update_actor(_proto(mine, global_token_num=[int(mine["attention_mask"].sum())] * 1))
        changed = [n for n, p in params.items() if not torch.equal(p.detach(), before[n])]
        out["changed"] = len(changed)
        out["params"] = len(params)
        out["finite"] = all(bool(torch.isfinite(p).all()) for p in params.values())
        opt = actor.actor_optimizer
        out["optimizer"] = sorted({type(o).__name__ for o in getattr(opt, "chained_optimizers", [opt])})
        out["metrics"] = sorted(metrics.meta_info["metrics"])

    if bf16:
        from megatron.training import get_args

        args = get_args()
        args.bf16, args.params_dtype = True, torch.bfloat16
        ref16 = ActorRolloutRefWorker(cfg.actor_rollout_ref, "ref")
        ref16.init_model()
        lp16 = ref16.compute_ref_log_prob(_proto(inputs)).batch["ref_log_prob"]
        out["bf16_dtype"] = str(next(unwrap_model(ref16.ref_module[0]).parameters()).dtype)
        out["bf16"] = float((lp16 - ref_lp)[mask].abs().max())
        out["bf16_mean"] = float((lp16 - ref_lp)[mask].abs().mean())
        del ref16
        if grads:
            # the same gradient comparison with a bf16 actor (fp32 gradient buffer, as Megatron keeps with --bf16)
            actor16 = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")
            actor16.init_model()
            a16 = actor16.actor
            a16.config.recompute_old_log_prob = False
            for chunk in a16.actor_module:
                chunk.zero_grad_buffer()
            a16.forward_backward_batch(_proto(mine, temperature=TEMPERATURE), micro_batch_size=1, mini_batch_size=BATCH)
            p16 = dict(unwrap_model(a16.actor_module[0]).named_parameters())
            for w in ("weight1", "weight2"):
                got = p16[f"decoder.layers.{MOE_LAYER}.mlp.experts.{w}"].main_grad.view(-1)
                ref_g = want[w].reshape(-1)
                out[f"bf16_grad_{w}"] = float((got - ref_g).abs().max() / ref_g.abs().max())
                out[f"bf16_grad_cos_{w}"] = float(torch.nn.functional.cosine_similarity(got, ref_g, dim=0))
    return out


def golden_ranks(assets: dict[str, str], ckpt: str, ranks: int, deadline_s: float, **layout: Any) -> list[dict]:
    """`rank_golden` on `ranks` ranks, from the HF model and its conversion `assets[ckpt]`; printed for the log."""
    results = run_ranks(
        rank_golden,
        ranks,
        deadline_s,
        preload=("verl_patches.prelude_patch",),
        kwargs=dict(hf=assets["hf"], ckpt=assets[ckpt], **layout),
    )
    print(json.dumps(results, indent=1))
    return results


def test_golden_tp2_ep2(assets: dict[str, str]) -> None:
    results = golden_ranks(assets, "tp2ep2", 4, 900, tp=2, pp=1, ep=2, layer_list=None, grads=True, bf16=True)
    for r in results:
        assert r["dp"] == 2
        assert r["actor"] < FP32_TOL and r["ref"] < FP32_TOL, r
        assert r["grad_scale"] > 1e-3, r  # the compared gradients are not all zero
        assert r["grad_weight1"] < FP32_TOL and r["grad_weight2"] < FP32_TOL, r
        assert r["finite"] and r["changed"] > 0.9 * r["params"], r
        assert r["optimizer"] == ["DistributedOptimizer"], r  # dense and expert parameters, each distributed
        assert r["bf16_dtype"] == "torch.bfloat16" and r["bf16"] < BF16_TOL and r["bf16_mean"] < BF16_MEAN_TOL, r
        assert r["bf16_grad_cos_weight1"] > BF16_GRAD_COS and r["bf16_grad_cos_weight2"] > BF16_GRAD_COS, r


def test_golden_pp2_uneven_layer_list(assets: dict[str, str]) -> None:
    results = golden_ranks(assets, "pp2", 2, 600, tp=1, pp=2, ep=1, layer_list=[1, 2], grads=False, bf16=False)
    for r in results:
        assert r["actor"] < FP32_TOL and r["ref"] < FP32_TOL, r
