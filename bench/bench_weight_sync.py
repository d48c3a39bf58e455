"""Weight-sync benchmark: the real Megatron → rollout sync over gloo, all-to-all path vs all-gather path.

Eight CPU processes hold a DeepSeek-V3-shaped model (MLA, dense + MoE layers, grouped-GEMM experts) as
MindSpeed-LLM's shards at training TP2·PP2·EP2 with TP-extend-EP and an uneven layer list; the rollout is
the A3 layout scaled down (rollout TP2, one instance whose expert parallelism spans all ranks, or two
with ``--instances 2``). Both paths run in the same processes on the same weights:

  * bytes each rank sends and receives, as handed to the collectives (measured, not modelled);
  * each rank's extra peak memory: the most bytes the sync held at once in buffers it allocated;
  * both against the planner's lower bound (every byte a rank loads and does not hold must arrive;
    the largest such tensor must be materialised), goal ratio 1.00, and against each other;
  * wall time of a full sync (median over ``--repeats``, slowest rank), the rollout's consumer being a
    plain iteration (the loader's own copy is the same for both paths).

Both paths must yield identical tensors (checked). Prints a PASS/FAIL line; exit status 1 on FAIL.

    .venv/bin/python bench/bench_weight_sync.py [--hidden 256] [--experts 16] [--repeats 3] [--instances 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere: repo root imports

WORLD, TP, PP, EP, LAYER_LIST = 8, 2, 2, 2, (2, 3)


def model_config(args: argparse.Namespace) -> dict:
    from verl_patches.weights.config import make_tiny_config

    return make_tiny_config(
        args.vocab,
        num_hidden_layers=sum(LAYER_LIST),
        first_k_dense_replace=1,
        n_routed_experts=args.experts,
        hidden_size=args.hidden,
        moe_intermediate_size=args.moe_ffn,
        intermediate_size=4 * args.moe_ffn,
    )


def layouts(instances: int):
    from verl_patches.reshard.layout import MegatronLayout, RolloutLayout

    return MegatronLayout(WORLD, tp=TP, pp=PP, ep=EP), RolloutLayout(
        WORLD, tp=2, dp_per_instance=WORLD // 2 // instances
    )


def _groups(training, rank):
    import torch.distributed as dist

    from verl_patches.sync.generator import SyncGroups

    def mine(groups):
        out = None
        for g in groups:
            pg = dist.new_group(g)
            if rank in g:
                out = pg
        return out

    return SyncGroups(
        tp=mine(training.rank_groups("tp")),
        pp=mine(training.rank_groups("pp")),
        tp_ep=mine(training.rank_groups("tp-ep", independent_ep=True)),
    )


class _DictSource:
    """``TensorSource`` over an in-memory HF state dict."""

    def __init__(self, sd: dict) -> None:
        self.sd = sd

    def get(self, name: str):
        return self.sd[name]

    def rows(self, name: str, start: int, stop: int):
        return self.sd[name][start:stop]

    def cols(self, name: str, start: int, stop: int):
        return self.sd[name][:, start:stop]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.sd[name].shape)

    def dtype(self, name: str):
        return self.sd[name].dtype


def _local_shards(cfg: dict, training, rank: int) -> dict:
    """This rank's Megatron shards, each owning its storage; the full HF state dict is freed on return."""
    from verl_patches.sync.param_table import weights_layout
    from verl_patches.weights.hf_schema import hf_tensor_specs
    from verl_patches.weights.hf_to_mcore import build_rank_state_dict
    from verl_patches.weights.layout import Rank
    from verl_patches.weights.synthetic import random_tensor

    hf = {s.name: random_tensor(s, 0) for s in hf_tensor_specs(cfg)}
    c = training.coords(rank)
    shards = build_rank_state_dict(_DictSource(hf), cfg, weights_layout(TP, PP, EP, LAYER_LIST), Rank(c.tp, c.pp, c.ep))
    return {k: v.clone() for k, v in shards.items()}


def _worker(rank: int, world: int, args: argparse.Namespace) -> dict:
    import torch.distributed as dist

    from verl_patches.sync.generator import SyncMeter, iter_rollout_weights
    from verl_patches.sync.plan import SyncPath, build_sync_plan, lower_bound

    cfg = model_config(args)
    training, rollout = layouts(args.instances)
    local = _local_shards(cfg, training, rank)
    groups = _groups(training, rank)
    out = {}
    checks = {}
    for path in (SyncPath.ALL_TO_ALL, SyncPath.ALL_GATHER):
        plan = build_sync_plan(cfg, training, rollout, LAYER_LIST, path=path)
        meter = SyncMeter()
        digest = {n: float(t.double().sum()) for n, t in iter_rollout_weights(plan, rank, local, groups, meter)}
        checks[path.value] = digest
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in iter_rollout_weights(plan, rank, local, groups):
                pass
            times.append(time.perf_counter() - t0)
        lb = lower_bound(plan, rank)
        out[path.value] = {
            "sent": meter.sent,
            "received": meter.received,
            "peak": meter.peak_extra,
            "calls": meter.calls,
            "lb_received": lb.received,
            "lb_peak": lb.peak_extra,
            "time_s": statistics.median(times),
        }
    out["same_tensors"] = checks["all-to-all"] == checks["all-gather"]
    return out


def run(args: argparse.Namespace) -> list[dict]:
    from verl_patches.multirank import run_ranks  # as this script's other imports of ours: in the function

    return run_ranks(_worker, WORLD, args.timeout, group_timeout_s=args.timeout / 2, kwargs={"args": args})


def ratio(a: float, b: float) -> str:
    return f"{a / b:6.2f}" if b else "   n/a"


def report(results: list[dict], args: argparse.Namespace) -> bool:
    kib = 1024
    print(
        f"Weight sync over gloo: {WORLD} CPU processes, training TP{TP}·PP{PP}·EP{EP} (TP-extend-EP, grouped GEMM, "
        f"layers {list(LAYER_LIST)}), rollout TP2 × {args.instances} instance(s) (EP{WORLD // args.instances}); "
        f"hidden {args.hidden}, {args.experts} experts of ffn {args.moe_ffn}, vocab {args.vocab}, bf16"
    )
    print(
        f"{'rank':>4} | {'path':10} | {'sent KiB':>9} {'recv KiB':>9} {'LB recv':>9} {'recv/LB':>7} | "
        f"{'peak KiB':>9} {'LB peak':>9} {'peak/LB':>7} | {'calls':>5} {'time ms':>8}"
    )
    for r, res in enumerate(results):
        for path in ("all-to-all", "all-gather"):
            m = res[path]
            print(
                f"{r:>4} | {path:10} | {m['sent'] / kib:9.1f} {m['received'] / kib:9.1f} {m['lb_received'] / kib:9.1f} "
                f"{ratio(m['received'], m['lb_received']):>7} | {m['peak'] / kib:9.1f} {m['lb_peak'] / kib:9.1f} "
                f"{ratio(m['peak'], m['lb_peak']):>7} | {m['calls']:5d} {m['time_s'] * 1e3:8.1f}"
            )

    def worst(path: str, key: str, lb: str | None = None) -> float:
        return max((res[path][key] / res[path][lb]) if lb else res[path][key] for res in results)

    a2a_recv, ag_recv = worst("all-to-all", "received", "lb_received"), worst("all-gather", "received", "lb_received")
    a2a_peak, ag_peak = worst("all-to-all", "peak", "lb_peak"), worst("all-gather", "peak", "lb_peak")
    total = {p: sum(res[p]["received"] for res in results) for p in ("all-to-all", "all-gather")}
    max_sent = {p: max(res[p]["sent"] for res in results) for p in ("all-to-all", "all-gather")}
    t = {p: max(res[p]["time_s"] for res in results) for p in ("all-to-all", "all-gather")}
    max_peak = {p: max(res[p]["peak"] for res in results) for p in ("all-to-all", "all-gather")}
    print("\nratios (worst rank):")
    print(f"  received / lower bound        all-to-all {a2a_recv:.2f}   all-gather {ag_recv:.2f}   (goal 1.00)")
    print(f"  extra peak memory / bound     all-to-all {a2a_peak:.2f}   all-gather {ag_peak:.2f}   (goal 1.00)")
    print(
        f"  all-to-all / all-gather:      bytes moved {total['all-to-all'] / total['all-gather']:.3f}, "
        f"max sent by one rank {max_sent['all-to-all'] / max_sent['all-gather']:.3f}, "
        f"peak memory {max_peak['all-to-all'] / max_peak['all-gather']:.3f}, "
        f"wall time {t['all-to-all'] / t['all-gather']:.3f} "
        f"({t['all-to-all'] * 1e3:.1f} ms vs {t['all-gather'] * 1e3:.1f} ms, median of {args.repeats}, slowest rank)"
    )
    ok = True
    for cond, what in (
        (all(r["same_tensors"] for r in results), "both paths yield identical tensors"),
        (
            all(r["all-to-all"]["received"] == r["all-to-all"]["lb_received"] for r in results),
            "all-to-all receives exactly the lower bound on every rank",
        ),
        (total["all-to-all"] < total["all-gather"], "all-to-all moves fewer bytes than all-gather"),
        (a2a_peak <= ag_peak, "all-to-all peak memory ratio <= all-gather's"),
    ):
        print(f"  [{'ok' if cond else 'FAIL'}] {what}")
        ok &= cond
    print("PASS" if ok else "FAIL")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--moe-ffn", type=int, default=128)
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--instances", type=int, default=1, choices=(1, 2))
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", type=Path, help="also write the per-rank measurements here")
    args = p.parse_args(argv)
    results = run(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if report(results, args) else 1


if __name__ == "__main__":
    sys.exit(main())
