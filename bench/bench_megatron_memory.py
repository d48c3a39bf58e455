"""Preflight memory estimate vs the bytes the tiny Megatron run actually holds, per rank.

For each layout the golden test runs (TP2 x EP2 on 4 ranks, PP2 with the layer list [1, 2] on 2 ranks), the
actor is built by verl's Megatron worker exactly as in the A3 job (bf16, MindSpeed-LLM's DeepSeek-V3, the
distributed optimizer), one update step is taken, and each rank reports:

- parameters: bytes of its model parameters;
- gradients: bytes of Megatron's gradient buffers (dense and expert-parallel);
- optimizer state: bytes of its shard of fp32 main parameters plus Adam's two moments;
- activations: bytes of the tensors autograd saves for backward in one forward of one micro-batch of
  ``--seq-len`` tokens (storages counted once, parameters excluded), at the profile's micro-batch size of 1.

Next to each, the figure ``verl_patches.launch.preflight.memory_estimate`` predicts for that rank, and the ratio
measured / estimated. Goal: within +-10% for parameters, gradients and optimizer state (PASS/FAIL line);
activations are reported only.

    .venv/bin/python bench/bench_megatron_memory.py [--seq-len 64] [--layouts tp2ep2,pp2]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "megatron_engine"))  # the golden test's assets

GOAL = 0.10
LAYOUTS = {
    "tp2ep2": dict(world=4, tp=2, pp=1, ep=2, layer_list=None),
    "pp2": dict(world=2, tp=1, pp=2, ep=1, layer_list=[1, 2]),
}


def _unique_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel())
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total


def measure_rank(rank: int, world: int, hf: str, tp: int, pp: int, ep: int, layer_list, seq_len: int) -> dict:
    import torch
    from megatron.core import parallel_state as mpu
    from omegaconf import open_dict
    from verl import DataProto
    from verl.utils.megatron_utils import unwrap_model
    from verl.workers.megatron_workers import ActorRolloutRefWorker

    from golden_assets import make_batch, worker_config

    cfg = worker_config(Path(hf), Path(hf), tp, pp, ep, layer_list)
    with open_dict(cfg):
        cfg.actor_rollout_ref.actor.load_weight = False
        cfg.actor_rollout_ref.ref.load_weight = False
    w = ActorRolloutRefWorker(cfg.actor_rollout_ref, "actor")  # bf16, as the A3 job
    w.init_model()
    chunks = w.actor_module
    params = [p for c in chunks for p in unwrap_model(c).parameters()]
    out = {
        "rank": rank,
        "stage": mpu.get_pipeline_model_parallel_rank(),
        "dtype": str(params[0].dtype),
        "params": _unique_bytes(params),
    }
    out["grads"] = sum(
        b.grad_data.numel() * b.grad_data.element_size()
        for c in chunks
        for b in list(c.buffers) + list(getattr(c, "expert_parallel_buffers", []))
    )

    vocab = json.loads((Path(hf) / "config.json").read_text())["vocab_size"]
    batch = make_batch(vocab)
    dp, r = mpu.get_data_parallel_world_size(), mpu.get_data_parallel_rank()
    n = batch["input_ids"].shape[0] // dp
    mine = {k: v[r * n : (r + 1) * n] for k, v in batch.items()}
    w.update_actor(
        DataProto.from_dict(tensors=mine, meta_info={"global_token_num": [int(mine["attention_mask"].sum())]})
    )
    opt = w.actor_optimizer
    state = []
    for sub in getattr(opt, "chained_optimizers", [opt]):
        for group in getattr(sub, "shard_fp32_from_float16_groups", []) + getattr(sub, "shard_fp32_groups", []):
            state += list(group)
        for st in sub.optimizer.state.values():
            state += [v for k, v in st.items() if torch.is_tensor(v) and v.dim() > 0]
    out["optimizer"] = _unique_bytes(state)

    # activations: what autograd keeps for backward during one micro-batch of seq_len tokens
    saved: list = []

    def pack(t):
        saved.append(t)
        return t

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, seq_len), generator=g)
    act = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(seq_len)[None],
        "responses": ids[:, -seq_len // 2 :],
        "advantages": torch.ones(1, seq_len // 2),
    }
    data = DataProto.from_dict(tensors=act, meta_info={"temperature": cfg.actor_rollout_ref.rollout.temperature})
    a = w.actor
    for c in chunks:
        c.zero_grad_buffer()
    # the forward pass of the schedule with autograd recording (what the update keeps until its backward)
    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        a.forward_backward_batch(data, forward_only=True, micro_batch_size=1)
    ids_params = {(p.untyped_storage().data_ptr()) for p in params}
    out["activations"] = _unique_bytes([t for t in saved if t.untyped_storage().data_ptr() not in ids_params])
    return out


def estimate_rank(cfg: dict, tp: int, pp: int, ep: int, layer_list, world: int, stage: int, seq_len: int) -> dict:
    from verl_patches.launch.preflight import memory_estimate as me
    from verl_patches.reshard.model_dims import ModelDims

    m = ModelDims.from_hf_config(cfg)
    layers = tuple(layer_list) if layer_list else (cfg["num_hidden_layers"] // pp,) * pp
    t = me.TrainingSetup(
        tp=tp,
        pp=pp,
        ep=ep,
        cp=1,
        world=world,
        layer_list=layers,
        seq_len=seq_len,
        micro_batch=1,
        micro_batches_per_step=1,
        sequence_parallel=tp > 1,
        tp_extend_ep=True,
    )
    p = me.rank_params(m, tp, ep, layers, stage)
    act, _ = me.stage_activation_bytes(m, t, stage)
    return {
        "params": me.BF16 * p.total,
        "grads": me.FP32 * p.total,
        "optimizer": me.optimizer_shard_bytes(t, p),
        "activations": act,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--layouts", default="tp2ep2,pp2")
    a = ap.parse_args()
    from golden_assets import build_hf_model
    from verl_patches.multirank import run_ranks

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        hf = build_hf_model(Path(tmp))
        cfg = json.loads((hf / "config.json").read_text())
        for name in a.layouts.split(","):
            lay = LAYOUTS[name]
            results = run_ranks(
                measure_rank,
                lay["world"],
                900,
                preload=("verl_patches.prelude_patch",),
                kwargs=dict(
                    hf=str(hf),
                    tp=lay["tp"],
                    pp=lay["pp"],
                    ep=lay["ep"],
                    layer_list=lay["layer_list"],
                    seq_len=a.seq_len,
                ),
            )
            print(
                f"\n== {name}: TP{lay['tp']} PP{lay['pp']} EP{lay['ep']} layers {lay['layer_list'] or 'even'}, "
                f"{lay['world']} ranks, {results[0]['dtype']} =="
            )
            print(f"{'rank':>4} {'stage':>5} {'component':<12} {'measured B':>12} {'estimated B':>12} {'ratio':>7}")
            for res in results:
                est = estimate_rank(
                    cfg, lay["tp"], lay["pp"], lay["ep"], lay["layer_list"], lay["world"], res["stage"], a.seq_len
                )
                for comp in ("params", "grads", "optimizer", "activations"):
                    ratio = res[comp] / est[comp] if est[comp] else float("nan")
                    goal = comp != "activations"
                    flag = "" if not goal else (" ok" if abs(ratio - 1) <= GOAL else " OUT")
                    ok &= (not goal) or abs(ratio - 1) <= GOAL
                    print(
                        f"{res['rank']:>4} {res['stage']:>5} {comp:<12} {res[comp]:>12.0f} {est[comp]:>12.0f} "
                        f"{ratio:>7.3f}{flag}"
                    )
    print(
        f"\n{'PASS' if ok else 'FAIL'}: parameters, gradients and optimizer state within +-{GOAL:.0%} of the "
        "preflight estimate on every rank (activations reported only)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
