"""Peak RSS of HF -> Megatron conversion: ours (one rank at a time, lazy slices) vs load-everything.

    .venv/bin/python bench/bench_convert_memory.py

Two synthetic DeepSeek-V3-shaped BF16 checkpoints whose expert count differs by 8x are converted with
the same per-rank share (TP-extend-EP with EP growing 8x, as 61 layers / 256 experts spread over 256
ranks for the real model). Each conversion runs in a fresh process that reports its peak RSS
(``ru_maxrss``, which also counts pages of memory-mapped files) and its RSS after imports. The baseline
loads every tensor into memory first and then builds the same rank state dicts (what the vendor's
converter does per pipeline stage; with the whole model when PP = 1). Goal: our peak above the
interpreter nearly flat as the model grows 8x (<= 1.5x) and a small fraction (<= 25 %) of the baseline's.
A third run with source mappings released every 8 MiB separates our peak into interpreter + fixed +
rank + mapped source pages; that model is applied to the real 671B layout.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FLAT_GOAL = 1.5
FRACTION_GOAL = 0.25
A3_LAYOUT = dict(
    tp=4, pp=8, ep=8, num_layer_list=(7, 7, 8, 8, 8, 8, 8, 7), moe_grouped_gemm=True, moe_tp_extend_ep=True
)


def bench_config(n_experts: int) -> dict:
    from verl_patches.weights.config import make_tiny_config

    return make_tiny_config(
        1024,
        hidden_size=512,
        intermediate_size=512,
        moe_intermediate_size=512,
        num_hidden_layers=5,
        first_k_dense_replace=1,
        n_routed_experts=n_experts,
        n_group=8,
        topk_group=4,
        num_experts_per_tok=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        q_lora_rank=128,
        kv_lora_rank=64,
        qk_nope_head_dim=32,
        qk_rope_head_dim=16,
        v_head_dim=32,
    )


def child(mode: str, src: str, dst: str, layout_json: str, remap: str) -> None:
    """Runs in a fresh interpreter; prints one JSON line with its memory figures."""
    import resource

    import psutil
    import torch

    from verl_patches.weights.config import load_config
    from verl_patches.weights.hf_to_mcore import build_rank_state_dict, convert_hf_to_mcore, rank_file, rank_sizes
    from verl_patches.weights.layout import ParallelLayout, all_ranks
    from verl_patches.weights.st_reader import CheckpointIndex, LazyCheckpoint

    base = psutil.Process().memory_info().rss
    layout = ParallelLayout.from_json(json.loads(layout_json))
    cfg = load_config(src)
    t = time.perf_counter()
    if mode == "ours":
        convert_hf_to_mcore(src, dst, layout, progress=False, remap_bytes=int(remap))
    else:
        index = CheckpointIndex.load(src)
        with LazyCheckpoint(index, remap_bytes=1 << 62) as ck:  # load everything, as owned memory
            everything = {n: ck.get(n).clone() for n in index.weight_map}

        class InMemory:
            def get(self, n):
                return everything[n]

            def rows(self, n, a, b):
                return everything[n][a:b]

            def cols(self, n, a, b):
                return everything[n][:, a:b]

            def shape(self, n):
                return tuple(everything[n].shape)

            def dtype(self, n):
                return everything[n].dtype

        for rank in all_ranks(layout):
            sd = build_rank_state_dict(InMemory(), cfg, layout, rank)
            path = rank_file(Path(dst), layout, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"model": sd, "checkpoint_version": 3.0, "iteration": 1}, path)
            del sd
    sizes = rank_sizes(cfg, layout)
    print(
        json.dumps(
            {
                "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                "base": base,
                "seconds": time.perf_counter() - t,
                "max_rank": max(sizes.values()),
                "model": sum(p.stat().st_size for p in Path(src).glob("*.safetensors")),
            }
        )
    )


def run_child(mode: str, src: Path, dst: Path, layout, remap: int = 0) -> dict:
    from verl_patches.weights.st_reader import DEFAULT_REMAP_BYTES

    shutil.rmtree(dst, ignore_errors=True)
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            mode,
            str(src),
            str(dst),
            json.dumps(layout.to_json()),
            str(remap or DEFAULT_REMAP_BYTES),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
    )
    if out.returncode != 0:
        raise SystemExit(f"{mode} conversion failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    from verl_patches.weights.config import make_training_config
    from verl_patches.weights.estimates import summarize_plan
    from verl_patches.weights.layout import ParallelLayout
    from verl_patches.weights.synthetic import write_synthetic_checkpoint

    shm = Path("/dev/shm")
    tmp = Path(
        tempfile.mkdtemp(prefix="bench_mem_", dir=shm if shm.is_dir() and shutil.disk_usage(shm).free > 4e9 else None)
    )
    mb = 1024**2
    try:
        results = {}
        for label, experts, ep in (("small", 16, 1), ("large", 128, 8)):
            cfg = bench_config(experts)
            layout = ParallelLayout(tp=2, ep=ep, moe_grouped_gemm=True, moe_tp_extend_ep=True)
            src = tmp / f"hf_{label}"
            t = time.perf_counter()
            write_synthetic_checkpoint(src, cfg, num_shards=max(2, experts // 8), tokenizer_files=False)
            gen = time.perf_counter() - t
            ours = run_child("ours", src, tmp / f"ours_{label}", layout)
            base = run_child("baseline", src, tmp / f"base_{label}", layout)
            results[label] = (ours, base)
            if label == "small":  # same conversion, source mappings released every 8 MiB instead of 256 MiB
                results["remap"] = run_child("ours", src, tmp / f"ours_{label}", layout, remap=8 * mb)
            print(
                f"{label:5s} model {ours['model'] / mb:7.1f} MiB ({experts} experts, TP2 EP{ep} TP-extend-EP, "
                f"largest rank {ours['max_rank'] / mb:5.1f} MiB; generated in {gen:.1f} s)"
            )
            print(
                f"      ours     peak {ours['peak'] / mb:7.1f} MiB = interpreter {ours['base'] / mb:5.1f} + "
                f"{(ours['peak'] - ours['base']) / mb:6.1f} MiB  ({ours['seconds']:.1f} s)"
            )
            print(
                f"      baseline peak {base['peak'] / mb:7.1f} MiB = interpreter {base['base'] / mb:5.1f} + "
                f"{(base['peak'] - base['base']) / mb:6.1f} MiB  ({base['seconds']:.1f} s)"
            )
            shutil.rmtree(tmp / f"ours_{label}", ignore_errors=True)
            shutil.rmtree(tmp / f"base_{label}", ignore_errors=True)
            shutil.rmtree(src, ignore_errors=True)
        (o_s, b_s), (o_l, b_l) = results["small"], results["large"]
        growth = o_l["model"] / o_s["model"]
        ours_growth = (o_l["peak"] - o_l["base"]) / (o_s["peak"] - o_s["base"])
        base_growth = (b_l["peak"] - b_l["base"]) / (b_s["peak"] - b_s["base"])
        fraction = (o_l["peak"] - o_l["base"]) / (b_l["peak"] - b_l["base"])
        print(
            f"model grew {growth:.1f}x: our peak above the interpreter grew {ours_growth:.2f}x, "
            f"the baseline's {base_growth:.2f}x; ours is {fraction * 100:.0f} % of the baseline's at the large size"
        )
        ok_flat, ok_frac = ours_growth <= FLAT_GOAL, fraction <= FRACTION_GOAL
        print(
            f"{'PASS' if ok_flat else 'FAIL'}: peak RSS nearly flat as the model grows "
            f"(x{ours_growth:.2f}, goal <= x{FLAT_GOAL})"
        )
        print(
            f"{'PASS' if ok_frac else 'FAIL'}: peak RSS a small fraction of load-everything ({fraction * 100:.0f} %, "
            f"goal <= {FRACTION_GOAL * 100:.0f} %)"
        )

        # peak = interpreter + fixed + rank + mapped source pages (at most the remap interval)
        from verl_patches.weights.st_reader import DEFAULT_REMAP_BYTES

        o_r = results["remap"]
        rank = o_s["max_rank"]
        fixed = (o_r["peak"] - o_r["base"]) - rank - 8 * mb
        mapped = (o_s["peak"] - o_s["base"]) - rank - fixed
        print(
            f"measured model: peak = interpreter {o_s['base'] / mb:.0f} MiB + fixed {fixed / mb:.0f} MiB + rank "
            f"+ mapped source pages ({mapped / mb:.0f} MiB for a {rank / mb:.0f} MiB rank with remap "
            f"{DEFAULT_REMAP_BYTES // mb} MiB; "
            f"{(o_r['peak'] - o_r['base'] - rank - fixed) / mb:.0f} MiB with remap 8 MiB)"
        )
        full = make_training_config()
        plan = summarize_plan(full, ParallelLayout(**A3_LAYOUT))
        gib = 1024**3
        ours_671 = o_l["base"] + fixed + plan.max_rank_bytes + DEFAULT_REMAP_BYTES
        base_671 = b_l["base"] + plan.source_bytes + plan.max_rank_bytes
        print(
            f"extrapolated 671B, TP4 PP8 EP8 TP-extend-EP (largest rank {plan.max_rank_bytes / gib:.2f} GiB, "
            f"{plan.num_ranks} ranks, {plan.total_bytes / 1e12:.2f} TB written): peak RAM about "
            f"{ours_671 / gib:.1f} GiB per worker (load-everything: {base_671 / gib:.0f} GiB, "
            f"{ours_671 / base_671 * 100:.1f} % of it)"
        )
        return 0 if ok_flat and ok_frac else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:7])
        sys.exit(0)
    sys.exit(main())
