"""bf16 against fp32: how far the rollout engine's log-probs and expert routing are from the training engine's.

A3 samples with vllm-ascend's engine and trains with the Megatron actor, both in bf16; the tiny run is fp32
(the CPU-only V1 fp32 patch) so that its rollout_mismatch/* stays below 1e-3. This benchmark measures what
bf16 does to that gap, with both engines on this host's torch_npu emulation, side by side in one run:

  * the rollout: verl's own vLLMRollout with the tiny profile's resolved rollout config (A3's settings with
    small numbers: TorchAir graph mode, chunked prefill, MC2 at EP > 1, sampling at temperature 0.9 with
    top-k 50 / top-p 0.9), `LLM` bound to our `emulated_npu.build_llm` as the CPU lifecycle patch binds it, so
    vllm-ascend's NPUWorker / NPUModelRunner / CustomDeepseekV3ForCausalLM run for real (rollout DP x TP
    ranks, one instance, EP over all of them); the tiny model's weights loaded through the lifecycle as the
    weight sync does; responses forced to full length (``ignore_eos``, A3's random-init benchmark mode) so
    most sampled tokens come from TorchAir graph decodes;
  * the training engine: verl's Megatron ``ActorRolloutRefWorker`` (MindSpeed-LLM + MindSpeed, TP1 EP1, our
    converter's checkpoint of the same model) scoring the tokens the rollout sampled, through the actor's
    own forward (tempered log-probs, the non-packed forward), as the golden test builds it;
  * for each dtype pair (bf16: A3's; fp32: the tiny run's), on the same weights and the tokens that pair's
    rollout sampled: the band of |Δ log p| per response token (Δ = train - rollout: mean, p99, max, share
    above 1 nat, and mean |exp(Δ) - 1| and max |Δ| as `logprob_mismatch` computes the run's metrics), the
    share of weights truncated importance sampling would cap at 2 (exp(Δ) > 2), and the share of routing
    flips: token positions whose selected expert set differs between the engines in some MoE layer.

Routing is recorded where each engine decides it: the rollout's top-k expert ids (vllm-ascend's
`select_experts`, or `npu_moe_gating_top_k` for 256 experts) pass through an identity custom op that
copies them out at run time, inside the TorchAir graph as in eager steps, and each engine step's rows are
mapped to (request, position) from the model runner's own schedule; the Megatron router's indices come from
forward hooks on its TopKRouter modules. The fp32 pair is the control: its flips are near-ties only.

    .venv/bin/python bench/bench_bf16_mismatch.py [--prompts 8] [--response 32] [--rollout-tp 1]
        [--rollout-dp 2] [--work-dir outputs/bench_bf16_mismatch]

Prints the table, the bf16/fp32 contrast and a PASS/FAIL line (exit status 1 on FAIL): PASS when the fp32
control agrees as the tiny run must (mean |Δ| below 1e-3) and the bf16 pair stays below the A3 profiles'
warning thresholds (overlay.rollout_mismatch_gate, read by the fit loop's own reader), i.e. the gate the
cluster runs does not fire on bf16 numerics alone. Writes ``results.json`` in the work folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root imports

REPO = Path(__file__).resolve().parents[1]

from verl_patches.base.atomic_write import write_atomically, write_json_atomically  # noqa: E402  (stdlib only)

DTYPES = ("bfloat16", "float32")
FP32_BAR = 1e-3  # the tiny run's bound on rollout_mismatch/logprob_abs_diff_mean (fp32 engines)
TIS_CAP = 2.0  # the A3 profiles' actor_rollout_ref.actor.rollout_correction.tis_cap
ROLLOUT_RANK_FLAG = "--rollout-rank"  # argv of this file when it runs as one rollout rank
PAD_ROUTE = -1


# ---------------------------------------------------------------------------------------------------------
# pure: the measures


def logprob_band(train: Any, rollout: Any, mask: Any) -> dict[str, float]:
    """|Δ log p| over the masked tokens (Δ = train - rollout): the run's own metrics (`mismatch_metrics`) and
    the band's shape (p99, share above 1 nat, share of TIS weights capped at `TIS_CAP`)."""
    import torch

    from verl_patches.worker_calls.logprob_mismatch import mismatch_metrics

    out = dict(mismatch_metrics(rollout, train, mask))
    delta = (train.double() - rollout.double())[mask.bool()]
    a = delta.abs()
    out["p99_abs_diff"] = float(torch.quantile(a, 0.99))
    out["share_above_1_nat"] = float((a > 1.0).double().mean())
    out["share_tis_capped"] = float((delta > math.log(TIS_CAP)).double().mean())
    return out


def step_rows(req_ids: list[str], counts: list[int], positions: list[int]) -> list[tuple[str, int]]:
    """(request, position) of each token row of one engine step, in the model runner's order: each
    request's scheduled tokens are consecutive rows, in the order of its input batch."""
    if sum(counts) != len(positions):
        raise ValueError(f"engine step: {sum(counts)} scheduled tokens but {len(positions)} positions")
    rows, at = [], 0
    for req, n in zip(req_ids, counts):
        rows += [(req, positions[at + i]) for i in range(n)]
        at += n
    return rows


def merge_tp_taps(per_tp_rank: list[list[list[list[int]]]]) -> list[list[list[int]]]:
    """One step's routing rows per MoE layer, from each TP rank's taps (`per_tp_rank[t][layer]` = rows):
    vllm-ascend splits a step's (padded) rows over the TP ranks in order (`torch.tensor_split`), so the
    step's rows are the TP ranks' rows concatenated."""
    layers = {len(t) for t in per_tp_rank}
    if len(layers) != 1:
        raise ValueError(f"TP ranks recorded different numbers of MoE layers in one step: {sorted(layers)}")
    return [[row for t in per_tp_rank for row in t[layer]] for layer in range(layers.pop())]


def rollout_routes(steps: list[dict], n_layers: int) -> dict[str, dict[int, list[list[int]]]]:
    """request -> position -> the sorted expert ids per MoE layer, from one engine's steps (TP taps merged)."""
    routes: dict[str, dict[int, list[list[int]]]] = {}
    for step in steps:
        taps = step["taps"]
        if len(taps) != n_layers:
            raise ValueError(f"engine step recorded {len(taps)} routing decisions for {n_layers} MoE layers")
        rows = step_rows(step["req_ids"], step["counts"], step["positions"])
        for layer, ids in enumerate(taps):
            if len(ids) < len(rows):
                raise ValueError(f"MoE layer {layer}: {len(ids)} routed rows for {len(rows)} scheduled tokens")
            for (req, pos), experts in zip(rows, ids):  # rows past the scheduled tokens are graph padding
                routes.setdefault(req, {}).setdefault(pos, [[] for _ in range(n_layers)])[layer] = sorted(experts)
    return routes


def routing_flips(
    rollout: dict[int, list[list[int]]], train: list[list[list[int]]], first_response: int
) -> tuple[dict[str, int], set[int]]:
    """Counts for one sequence: positions both engines routed, and those whose expert set differs in some
    MoE layer (all positions, and the response's: the decode inputs); (position, layer) pairs likewise; and
    the flipped positions. `train[layer][pos]`: the training engine's expert ids at token `pos`."""
    c = dict(tokens=0, flipped=0, response_tokens=0, response_flipped=0, pairs=0, flipped_pairs=0)
    flipped = set()
    for pos, layers in rollout.items():
        diff = [sorted(train[layer][pos]) != experts for layer, experts in enumerate(layers)]
        c["tokens"] += 1
        c["pairs"] += len(diff)
        c["flipped_pairs"] += sum(diff)
        if any(diff):
            c["flipped"] += 1
            flipped.add(pos)
        if pos >= first_response:
            c["response_tokens"] += 1
            c["response_flipped"] += any(diff)
    return c, flipped


def flip_shares(counts: list[dict[str, int]]) -> dict[str, float]:
    total = {k: sum(c[k] for c in counts) for k in counts[0]}
    return {
        "routed_tokens": float(total["tokens"]),
        "flip_share": total["flipped"] / max(1, total["tokens"]),
        "flip_share_response": total["response_flipped"] / max(1, total["response_tokens"]),
        "flip_share_token_layer": total["flipped_pairs"] / max(1, total["pairs"]),
    }


# ---------------------------------------------------------------------------------------------------------
# the rollout: one rank of verl's vLLMRollout on vllm-ascend's engine (this file run by run_rank_scripts)

_TAPS: list[list[list[int]]] = []
_RECORDING = [False]


def _record_route(topk_ids: Any) -> None:
    if _RECORDING[0]:
        _TAPS.append(topk_ids.detach().to("cpu").long().tolist())


def install_route_taps() -> None:
    """Before the engine is built (its graphs are traced once): the rollout's top-k expert ids pass through an
    identity op that records them when a scheduled step runs. A registered op is one opaque node to dynamo,
    so the TorchAir graph keeps it and it runs at each graph replay."""
    import torch
    import torch_npu
    import vllm_ascend.ops.fused_moe as fused_moe
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    @torch.library.custom_op("bf16bench::route_tap", mutates_args=())
    def route_tap(topk_ids: torch.Tensor) -> torch.Tensor:
        _record_route(topk_ids)
        return topk_ids.clone()

    @route_tap.register_fake
    def _(topk_ids: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(topk_ids)

    select = fused_moe.select_experts

    def select_experts(*args: Any, **kwargs: Any) -> Any:
        weights, ids = select(*args, **kwargs)
        return weights, route_tap(ids)

    fused_moe.select_experts = select_experts
    if hasattr(torch_npu, "npu_moe_gating_top_k"):  # vllm-ascend's branch for 256 routed experts
        gating = torch_npu.npu_moe_gating_top_k

        def npu_moe_gating_top_k(*args: Any, **kwargs: Any) -> Any:
            weights, ids, out = gating(*args, **kwargs)
            return weights, route_tap(ids), out

        torch_npu.npu_moe_gating_top_k = npu_moe_gating_top_k

    process = NPUModelRunner._process_reqs

    def _process_reqs(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        start = len(_TAPS)
        _RECORDING[0] = True
        try:
            out = process(self, scheduler_output, *args, **kwargs)
        finally:
            _RECORDING[0] = False
        taps = _TAPS[start:]
        del _TAPS[start:]
        req_ids = list(self.input_batch.req_ids)
        total = int(scheduler_output.total_num_scheduled_tokens)
        STEPS.append(
            {
                "req_ids": req_ids,
                "counts": [int(scheduler_output.num_scheduled_tokens[r]) for r in req_ids],
                "positions": self.positions_cpu[:total].tolist(),
                "taps": taps,
            }
        )
        return out

    NPUModelRunner._process_reqs = _process_reqs


STEPS: list[dict] = []


def rollout_rank(spec_file: str, rank: int, world: int, port: int, out_file: str) -> None:
    """Build the A3 rollout, load the model's weights, sample this rank's prompts; write tokens, log-probs and
    the recorded engine steps to `out_file` (JSON)."""
    # first, as in every job process: the overlay's patches
    # deferred: after the prelude, as a job process imports them
    import torch.distributed as dist
    from omegaconf import OmegaConf
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoTokenizer
    from verl.utils.vllm_utils import patch_vllm_moe_model_weight_loader
    from verl.workers.rollout.vllm_rollout import vllm_rollout_spmd

    import verl_patches.prelude_patch  # noqa: F401
    from verl_patches.npu_emulation.wheel_contract.cpu_proof import SCALED_MODEL, declare
    from verl_patches.patches.verl.workers.rollout import emulated_npu
    from verl_patches.rollout.lifecycle import RolloutLifecycle, model_runner_of

    # the tiny model is below the MLA kernels' documented sizes: the CPU proof's declared exception, which a bf16
    # run declares itself (the fp32 patch declares it with the fp32 run's)
    declare(SCALED_MODEL)
    spec = json.loads(Path(spec_file).read_text())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    vllm_rollout_spmd.LLM = emulated_npu.build_llm  # the lifecycle patch's CPU binding, not the stand-in
    install_route_taps()
    model_dir = spec["model_dir"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rollout = vllm_rollout_spmd.vLLMRollout(
        model_dir, OmegaConf.create(spec["rollout"]), tokenizer, AutoConfig.from_pretrained(model_dir)
    )
    llm = rollout.inference_engine
    llm.wake_up(tags=["weights"])
    runner = model_runner_of(llm)
    patch_vllm_moe_model_weight_loader(runner.model)  # as the sharding manager does at each sync
    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    RolloutLifecycle(llm, device=runner.device).load_weights(iter(weights.items()))
    llm.wake_up(tags=["kv_cache"])
    STEPS.clear()
    params = rollout.sampling_params.clone()
    n, params.n = params.n, 1  # one request per sample: each sequence is one request of the engine steps
    prompts = [p for p in spec["prompts"][rank // spec["tp"]] for _ in range(n)]
    start = time.monotonic()
    outs = llm.generate(prompts=[{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
    seconds = time.monotonic() - start
    sequences = []
    for out in outs:
        sample = out.outputs[0]
        tokens = list(sample.token_ids)
        sequences.append(
            {
                "request": out.request_id,
                "prompt": list(out.prompt_token_ids),
                "response": tokens,
                "log_probs": [lp[t].logprob for lp, t in zip(sample.logprobs, tokens)],
            }
        )
    graph_steps = sum(all(c == 1 for c in s["counts"]) for s in STEPS)
    result = {"sequences": sequences, "steps": STEPS, "generate_s": seconds, "decode_only_steps": graph_steps}
    write_json_atomically(out_file, result, indent=None)


# ---------------------------------------------------------------------------------------------------------
# the training engine: verl's Megatron worker scoring the sampled tokens (one gloo rank, both dtypes)


def score_rank(
    rank: int,
    world: int,
    *,
    hf_dir: str,
    mcore_dir: str,
    batches: dict[str, str],
    temperature: float,
) -> dict[str, Any]:
    """For each dtype: the training engine's per-token log-probs of that pair's batch and its routing."""
    import gc

    import torch
    from megatron.core import parallel_state as mpu
    from megatron.training import get_args
    from omegaconf import open_dict
    from verl import DataProto
    from verl.utils.megatron_utils import unwrap_model
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    from verl_patches.checkpoint.safe_load import load_tensor_file
    from verl_patches.checks.engine_ranks import worker_config
    from verl_patches.patches.verl.workers.megatron_workers import trainer_config_view
    from verl_patches.train_engine.initialize import initialize_megatron
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron

    first = load_tensor_file(next(iter(batches.values())))
    n, response = first["responses"].shape
    cfg = worker_config(hf_dir, mcore_dir, 1, 1, 1, None, n, first["input_ids"].shape[1] - response, response)
    with open_dict(cfg):
        cfg.actor_rollout_ref.rollout.temperature = temperature
    initialize_megatron(translate_verl_train_configs_to_megatron(trainer_config_view(cfg.actor_rollout_ref)))
    args = get_args()
    out: dict[str, Any] = {"tp": mpu.get_tensor_model_parallel_world_size()}
    # fp32 first: MindSpeed-LLM's argument check wants --bf16 with grouped GEMM, fp32 parameters are set after it
    for dtype in sorted(batches, key=lambda d: d != "float32"):
        batch = load_tensor_file(batches[dtype])
        args.bf16, args.params_dtype = dtype == "bfloat16", getattr(torch, dtype)
        worker = ActorRolloutRefWorker(cfg.actor_rollout_ref, "ref")
        worker.init_model()
        model = unwrap_model(worker.ref_module[0])
        routes: dict[int, list[list[list[int]]]] = {}
        hooks = []
        for name, module in model.named_modules():
            if type(module).__name__ == "TopKRouter":
                layer = int(name.split("layers.")[1].split(".")[0])

                def keep(mod: Any, inputs: Any, output: Any, layer: int = layer, routes: dict = routes) -> None:
                    routes.setdefault(layer, []).append(output[1].detach().cpu().tolist())

                hooks.append(module.register_forward_hook(keep))
        log_probs = worker.compute_ref_log_prob(DataProto.from_dict(tensors=dict(batch))).batch["ref_log_prob"]
        for h in hooks:
            h.remove()
        out[dtype] = {
            "param_dtype": str(next(model.parameters()).dtype),
            "log_probs": log_probs.float().tolist(),
            # per MoE layer, one forward per sequence (micro-batch 1): [layer][sequence][token] -> expert ids
            "routes": [routes[layer] for layer in sorted(routes)],
        }
        del worker, model
        gc.collect()
    return out


# ---------------------------------------------------------------------------------------------------------
# the driver


def bench_config(args: argparse.Namespace, dtype: str) -> Any:
    """The tiny profile (A3's settings, small numbers) for this benchmark's rollout, resolved."""
    from verl_patches.trainer.config_compose import compose_config, resolved

    r = "actor_rollout_ref.rollout"
    world = args.rollout_tp * args.rollout_dp
    overrides = [
        f"overlay.tiny_assets_dir={args.work_dir / 'assets'}",
        f"overlay.vllm_dp_size={args.rollout_dp}",
        f"{r}.tensor_model_parallel_size={args.rollout_tp}",
        f"{r}.dtype={dtype}",
        f"{r}.ignore_eos=True",
        f"data.max_response_length={args.response}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={world}",
    ]
    saved = {k: os.environ.pop(k) for k in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH") if k in os.environ}
    try:
        return resolved(compose_config("ppo_tiny_local", overrides))
    finally:
        os.environ.update(saved)


def prepare_models(args: argparse.Namespace, cfg: Any) -> tuple[Any, Path]:
    """The tiny run's model (its builder, its spec) and our converter's Megatron checkpoint of it at TP1."""
    # the builder's supervised base pass routes through transformers' DeepseekV3: with the overlay's router
    # patch, as in the trainer entry that builds the tiny run's assets
    import verl_patches.prelude_patch  # noqa: F401
    from verl_patches.cpu_proof.tiny_a3 import tiny_spec
    from verl_patches.cpu_proof.tiny_assets import prepare, prepare_megatron
    from verl_patches.weights.layout import ParallelLayout

    assets = prepare(args.work_dir / "assets", tiny_spec(cfg), progress=False)
    layout = ParallelLayout(tp=1, pp=1, ep=1, moe_grouped_gemm=True, moe_tp_extend_ep=True)
    return assets, prepare_megatron(assets, args.work_dir / "mcore_tp1", layout, progress=False)


def prompt_ids(assets: Any, count: int, dp: int) -> list[list[list[int]]]:
    """`count` distinct training prompts with the chat template, as verl's dataset tokenizes them, dealt to
    the `dp` engines in turn."""
    import pandas as pd
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.model_dir)
    rows = pd.read_parquet(assets.train_parquet)["prompt"]
    chats = (tok.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False) for m in rows)
    texts = list(dict.fromkeys(chats))
    if len(texts) < count or count % dp:
        raise SystemExit(f"--prompts {count}: needs a multiple of --rollout-dp {dp}, at most {len(texts)}")
    ids = [tok.encode(t, add_special_tokens=False) for t in texts[:count]]
    return [ids[d::dp] for d in range(dp)]


def run_rollout(args: argparse.Namespace, cfg: Any, assets: Any, prompts: list, dtype: str) -> list[dict]:
    from omegaconf import OmegaConf

    from verl_patches.base.free_port import free_port_block
    from verl_patches.launch.job_env import rollout_engine_environment
    from verl_patches.multirank import run_rank_scripts
    from verl_patches.sources import dist_info

    if not Path(dist_info.path_entry(REPO), "vllm-0.9.1.dist-info").is_dir():
        from verl_patches.sources.lock import load_lock

        dist_info.generate(REPO, load_lock(REPO / "sources.lock"), ["vllm", "vllm_ascend"])
    world = args.rollout_tp * args.rollout_dp
    run_dir = args.work_dir / dtype
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = run_dir / "spec.json"
    write_json_atomically(
        spec,
        {
            "model_dir": str(assets.model_dir),
            "rollout": OmegaConf.to_container(cfg.actor_rollout_ref.rollout),
            "prompts": prompts,
            "tp": args.rollout_tp,
        },
    )
    # one block outside the ephemeral range (where other processes' connections take ports): the ranks' own gloo
    # group on its first port, F2's DP master ports (one DP group per TP rank) on the ports after it
    base = free_port_block(1 + args.rollout_tp)
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("VLLM_", "HCCL_"))}
    env.update(rollout_engine_environment())  # as the A3 job and the tiny run export them
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), dist_info.path_entry(REPO)]),
        VLLM_DP_SIZE=str(args.rollout_dp),
        HCCL_SOCKET_IFNAME="lo",
        ASCEND_RT_VISIBLE_DEVICES=",".join(str(r) for r in range(world)),
        VERL_PATCHES_VLLM_DP_BASE_PORT=str(base),  # DP master ports: base + 1 onwards
    )
    rendezvous = str(base)
    outs = [run_dir / f"rollout_rank{r}.json" for r in range(world)]
    run_rank_scripts(
        Path(__file__),
        world,
        args.timeout,
        args=lambda r: [ROLLOUT_RANK_FLAG, str(spec), str(r), str(world), rendezvous, str(outs[r])],
        rank_env=[env] * world,
        cwd=REPO,
    )
    return [json.loads(p.read_text()) for p in outs]


def rollout_batch(ranks: list[dict], tp: int, n_layers: int, pad_id: int) -> tuple[dict, list[dict]]:
    """The sampled sequences as the training engine's batch (left-padded prompts, full-length responses: the
    forced-length responses are all real tokens), and each sequence's rollout routing."""
    import torch

    seqs = []
    for d in range(len(ranks) // tp):
        group = ranks[d * tp : (d + 1) * tp]
        if len({len(r["steps"]) for r in group}) != 1:
            raise RuntimeError(f"rollout DP rank {d}: its TP ranks ran different numbers of engine steps")
        steps = [
            dict(group[0]["steps"][i], taps=merge_tp_taps([r["steps"][i]["taps"] for r in group]))
            for i in range(len(group[0]["steps"]))
        ]
        routes = rollout_routes(steps, n_layers)
        for s in group[0]["sequences"]:
            seqs.append(dict(s, routes=routes.get(s["request"], {})))
    response = len(seqs[0]["response"])
    if any(len(s["response"]) != response for s in seqs):
        raise RuntimeError("responses of different lengths: the benchmark forces full-length responses")
    prompt = max(len(s["prompt"]) for s in seqs)
    n = len(seqs)
    input_ids = torch.full((n, prompt + response), pad_id, dtype=torch.long)
    mask = torch.zeros(n, prompt + response, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids = s["prompt"] + s["response"]
        input_ids[i, -len(ids) :] = torch.tensor(ids)
        mask[i, -len(ids) :] = 1
    batch = {
        "input_ids": input_ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, -response:].clone(),
    }
    return batch, seqs


def pair_report(seqs: list[dict], batch: dict, train: dict, n_layers: int) -> dict[str, float]:
    import torch

    train_lp = torch.tensor(train["log_probs"], dtype=torch.float32)
    rollout_lp = torch.tensor([s["log_probs"] for s in seqs], dtype=torch.float32)
    out = logprob_band(train_lp, rollout_lp, torch.ones_like(train_lp))
    counts = []
    # response token t is predicted from the input at position prompt + t - 1: did that position flip?
    at_flip = torch.zeros_like(train_lp, dtype=torch.bool)
    for i, s in enumerate(seqs):
        # verl's Megatron forward moves each sequence's left padding to its end (remove_left_padding): the
        # router's row p is the sequence's token p
        length = len(s["prompt"]) + len(s["response"])
        per_layer = [train["routes"][layer][i][:length] for layer in range(n_layers)]
        c, flipped = routing_flips({int(p): r for p, r in s["routes"].items()}, per_layer, len(s["prompt"]))
        counts.append(c)
        for pos in flipped:
            t = pos - len(s["prompt"]) + 1
            if 0 <= t < at_flip.shape[1]:
                at_flip[i, t] = True
    out.update(flip_shares(counts))
    delta = (train_lp.double() - rollout_lp.double()).abs()
    # None (JSON null) where no token is in the class: no mean to give
    out["mean_abs_diff_at_flips"] = float(delta[at_flip].mean()) if at_flip.any() else None
    out["mean_abs_diff_elsewhere"] = float(delta[~at_flip].mean()) if (~at_flip).any() else None
    return out


COLUMNS = (
    ("mean |Δ|", "rollout_mismatch/logprob_abs_diff_mean", "{:.3e}"),
    ("p99 |Δ|", "p99_abs_diff", "{:.3e}"),
    ("max |Δ|", "rollout_mismatch/logprob_abs_diff_max", "{:.3e}"),
    (">1 nat", "share_above_1_nat", "{:.2%}"),
    ("mean |r-1|", "rollout_mismatch/ratio_abs_dev_mean", "{:.3e}"),
    (f"w>{TIS_CAP:g}", "share_tis_capped", "{:.2%}"),
    ("flips", "flip_share", "{:.2%}"),
    ("flips resp.", "flip_share_response", "{:.2%}"),
    ("flips tok×layer", "flip_share_token_layer", "{:.2%}"),
    ("|Δ| at flips", "mean_abs_diff_at_flips", "{:.3e}"),
    ("|Δ| elsewhere", "mean_abs_diff_elsewhere", "{:.3e}"),
    ("tokens", "rollout_mismatch/tokens", "{:.0f}"),
)


def report_lines(results: dict[str, dict[str, float]]) -> list[str]:
    head = f"{'pair':<9}" + "".join(f"{c:>16}" for c, _, _ in COLUMNS)
    lines = [head]
    for dtype, r in results.items():
        cells = ("-" if r[k] is None else fmt.format(r[k]) for _, k, fmt in COLUMNS)
        lines.append(f"{dtype:<9}" + "".join(f"{c:>16}" for c in cells))
    if set(DTYPES) <= set(results):
        b, f = results["bfloat16"], results["float32"]
        ratio = b["rollout_mismatch/logprob_abs_diff_mean"] / max(f["rollout_mismatch/logprob_abs_diff_mean"], 1e-30)
        lines.append(
            f"bf16 / fp32 mean |Δ log p|: {ratio:.3g}x; routing flips {b['flip_share']:.2%} vs {f['flip_share']:.2%} "
            f"of {b['routed_tokens']:.0f} / {f['routed_tokens']:.0f} routed token positions"
        )
    return lines


def verdict(results: dict[str, dict[str, float]], cfg: Any) -> tuple[bool, str]:
    """PASS/FAIL: the fp32 control within the tiny run's bound, the bf16 pair below the profile's warning."""
    from verl_patches.driver.mismatch_gate import OK, decide, thresholds_from_config

    problems = []
    control = results.get("float32")
    if control is not None and not control["rollout_mismatch/logprob_abs_diff_mean"] < FP32_BAR:
        problems.append(
            f"the fp32 control's mean |Δ| {control['rollout_mismatch/logprob_abs_diff_mean']:.3e} is not below "
            f"{FP32_BAR:g}: the pair does not compute the same model"
        )
    if "bfloat16" in results:
        gate = decide(results["bfloat16"], thresholds_from_config(cfg))
        if gate.action != OK:
            problems.append(
                "the bf16 pair crosses the A3 profiles' gate: " + "; ".join(c.describe() for c in gate.crossings)
            )
    return not problems, ("FAIL: " + "; ".join(problems)) if problems else "PASS"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=8, help="distinct prompts (x the profile's n samples each)")
    p.add_argument("--response", type=int, default=32, help="response tokens per sample (forced full length)")
    p.add_argument("--rollout-tp", type=int, default=1)
    p.add_argument("--rollout-dp", type=int, default=2, help="VLLM_DP_SIZE of the one instance (EP = DP x TP)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="pairs to measure, e.g. bfloat16 alone")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds each phase's ranks may take")
    p.add_argument("--work-dir", type=Path, default=REPO / "outputs" / "bench_bf16_mismatch")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dtypes = [d for d in args.dtypes.split(",") if d]
    if not dtypes or any(d not in DTYPES for d in dtypes):
        raise SystemExit(f"--dtypes {args.dtypes!r}: choose from {','.join(DTYPES)}")
    args.work_dir = args.work_dir.resolve()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    from verl_patches.base import cpu_numerics

    # the tiny run's CPU kernels (its launcher pins them before torch loads; the ranks inherit them), so the
    # pairs compute as the tiny run does and its model, built under the same pins, is the one measured
    os.environ.update(cpu_numerics.pinned(os.environ))
    import torch

    from verl_patches.checkpoint.safe_load import load_tensor_file  # noqa: F401  (the score rank reads with it)
    from verl_patches.multirank import run_ranks

    t0 = time.monotonic()
    cfgs = {d: bench_config(args, d) for d in dtypes}
    any_cfg = cfgs[dtypes[0]]
    assets, mcore = prepare_models(args, any_cfg)
    hf = json.loads((assets.model_dir / "config.json").read_text())
    n_layers = hf["num_hidden_layers"] - hf["first_k_dense_replace"]
    prompts = prompt_ids(assets, args.prompts, args.rollout_dp)
    r = any_cfg.actor_rollout_ref.rollout
    print(
        f"model: {hf['num_hidden_layers']} layers ({n_layers} MoE), {hf['n_routed_experts']} routed experts "
        f"(n_group {hf['n_group']}, topk_group {hf['topk_group']}, top-{hf['num_experts_per_tok']}), hidden "
        f"{hf['hidden_size']}, vocab {hf['vocab_size']}; rollout TP{args.rollout_tp} x DP{args.rollout_dp}, "
        f"{args.prompts} prompts x n={r.n} x {args.response} tokens at T={r.temperature}, top-k {r.top_k}, "
        f"top-p {r.top_p}",
        flush=True,
    )
    batches, seqs_of, timings = {}, {}, {}
    for dtype in dtypes:
        t = time.monotonic()
        ranks = run_rollout(args, cfgs[dtype], assets, prompts, dtype)
        timings[dtype] = time.monotonic() - t
        batch, seqs = rollout_batch(ranks, args.rollout_tp, n_layers, int(hf["pad_token_id"]))
        steps = sum(len(x["steps"]) for x in ranks[:: args.rollout_tp])
        decodes = sum(x["decode_only_steps"] for x in ranks[:: args.rollout_tp])
        print(
            f"rollout {dtype}: {len(seqs)} sequences, {steps} engine steps over the DP ranks ({decodes} "
            f"decode-only), {timings[dtype]:.0f} s with the engine build",
            flush=True,
        )
        path = args.work_dir / dtype / "batch.pt"
        write_atomically(path, lambda tmp, batch=batch: torch.save(batch, tmp))
        batches[dtype], seqs_of[dtype] = (batch, str(path)), seqs
    t = time.monotonic()
    (train,) = run_ranks(
        score_rank,
        1,
        args.timeout,
        preload=("verl_patches.prelude_patch",),
        kwargs=dict(
            hf_dir=str(assets.model_dir),
            mcore_dir=str(mcore),
            batches={d: p for d, (_, p) in batches.items()},
            temperature=float(r.temperature),
        ),
    )
    print(f"training engine scored both pairs in {time.monotonic() - t:.0f} s", flush=True)
    write_json_atomically(args.work_dir / "train.json", train, indent=None)
    results = {d: pair_report(seqs_of[d], batches[d][0], train[d], n_layers) for d in dtypes}
    ok, line = verdict(results, any_cfg)
    for text in report_lines(results) + [line]:
        print(text)
    record = {
        "command": "bench/bench_bf16_mismatch.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "model": {k: hf[k] for k in ("num_hidden_layers", "n_routed_experts", "n_group", "topk_group")},
        "train_param_dtypes": {d: train[d]["param_dtype"] for d in dtypes},
        "results": results,
        "verdict": line,
        "seconds": time.monotonic() - t0,
    }
    write_json_atomically(args.work_dir / "results.json", record)
    print(f"total {record['seconds']:.0f} s; {args.work_dir / 'results.json'}")
    return 0 if ok else 1


def _rollout_rank_main(argv: list[str]) -> None:
    spec, rank, world, port, out = argv
    rollout_rank(spec, int(rank), int(world), int(port), out)


ENTRY: dict[str, Callable[[list[str]], Any]] = {ROLLOUT_RANK_FLAG: _rollout_rank_main}

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ENTRY:
        ENTRY[sys.argv[1]](sys.argv[2:])
    else:
        sys.exit(main())
