"""Peak memory of `check_logprobs.py` on a slice of DeepSeek-V3 671B's real dimensions, against its estimate.

    flock /tmp/heavy.lock .venv/bin/python bench/bench_check_logprobs_memory.py [--layouts tp1,ep2]

The synthetic HF folder (built once, reused: ``~/.cache/verl_patches/bench/dsv3_671b_4layers_32experts``) has
the 671B config.json values (hidden 7168, vocab 129280, MLA ranks 1536/512, intermediate 18432,
moe_intermediate 2048, first 3 layers dense, n_group 8 / topk_group 4, 8 experts per token, one shared
expert, noaux_tc routing) except ``num_hidden_layers=4`` (the check, like the converter, wants every listed
layer present) and ``n_routed_experts=32`` (so ``--experts 16`` really slices the experts and the router);
random bf16 weights, written one tensor at a time, ~10.4 GB. Then, per layout,

    check_logprobs.py --hf DIR --layers 4 --experts 16 --tp 1 --pp 1 --ep 1 --engines megatron,rollout --tokens 16

runs as a child process while the summed RSS of its whole process tree (psutil, every 0.2 s) is sampled, with
the anonymous part (RssAnon, memory not backed by a file) next to it: pages of memory-mapped checkpoint files
count in RSS while resident but the kernel can drop them. Printed: peak summed RSS against the estimate's RSS
bound, peak summed RssAnon against the estimate of what must fit (`verl_patches.checks.memory`, printed by
the check itself and used to refuse), their ratio, wall time and the check's verdict.

Measured once (2-core / 24 GiB CPU host, 2026-11-23; bf16 slice: 3 dense layers + 1 MoE layer with 16 of the
32 experts, 4.54 B parameters, 9.08 GB = 8.46 GiB per copy), ``--tp 1 --pp 1 --ep 1``:

    peak summed RSS 18.90 GiB, peak summed RssAnon 18.60 GiB, wall 172 s (truncate 47 s, convert 29 s,
    reference 4 s, engine rank 88 s), PASS: megatron max |diff| 5.2e-3 (mean 2.4e-3), rollout 0.0 (bf16,
    tolerance 0.15). Estimate printed by that run: 20.41 GiB; with the process baselines recalibrated
    afterwards on the mid-size test (`tests/checks/test_check_memory_bound.py`) it is 20.16 GiB (RSS bound
    20.66 GiB): measured / estimate 0.92.

The peak is the engine rank holding verl's Megatron model and the rollout stand-in synced from it (two
copies, 16.9 GiB); the other 1.7 GiB are the main process and the rank's imports and buffers. Before the
changes that came with this bench the same run was killed by the kernel at 22.5 GiB: the stand-in first
built transformers' whole model in float32 next to the Megatron model. A 2-rank layout (``--ep 2``) of this
slice is refused up front (estimate 37.2 GiB: every rank holds its Megatron share plus a stand-in with every
dense weight, and rank 0 then gathers a whole EP-1 instance); use ``--layers``/``--experts`` to shrink it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "verl_patches" / "bench"
FOLDER = "dsv3_671b_4layers_32experts"
LAYOUTS = {"tp1": ["--tp", "1", "--pp", "1", "--ep", "1"], "ep2": ["--tp", "1", "--pp", "1", "--ep", "2"]}
GIB = 1024**3


def bench_config() -> dict:
    from verl_patches.weights.config import make_training_config

    cfg = make_training_config()
    cfg.update(num_hidden_layers=4, n_routed_experts=32, torch_dtype="bfloat16")
    return cfg


def synthetic_folder() -> Path:
    """The bench's HF folder, built into a temporary sibling and renamed when complete (so it is reused only
    whole)."""
    from verl_patches.base.atomic_write import rename_durably
    from verl_patches.cpu_proof.tiny_assets import build_tokenizer
    from verl_patches.weights.synthetic import write_synthetic_checkpoint

    out = CACHE / FOLDER
    if (out / "config.json").is_file():
        return out
    tmp = CACHE / (FOLDER + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    t0 = time.monotonic()
    cfg = bench_config()
    tok = build_tokenizer(tmp, ["What is 1 + 2 ? The answer is 3 ."], max_operand=9)
    cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    write_synthetic_checkpoint(tmp, cfg, num_shards=6, seed=0, tokenizer_files=False)
    rename_durably(tmp, out)
    print(f"built {out} in {time.monotonic() - t0:.0f} s", flush=True)
    return out


def run_layout(hf: Path, name: str, work: Path) -> dict:
    from verl_patches.checks.rss import TreeSampler
    from verl_patches.checks.run import CheckRequest, estimate_check_memory

    layout = LAYOUTS[name]
    argv = [
        sys.executable,
        str(REPO / "verl_patches/scripts/check_logprobs.py"),
        "--hf",
        str(hf),
        "--layers",
        "4",
        "--experts",
        "16",
        *layout,
        "--engines",
        "megatron,rollout",
        "--tokens",
        "16",
        "--work-dir",
        str(work),
    ]
    kv = dict(zip(layout[::2], layout[1::2]))
    req = CheckRequest(
        hf=hf, tp=int(kv["--tp"]), pp=int(kv["--pp"]), ep=int(kv["--ep"]), layers=4, experts=16, tokens=16
    )
    est = estimate_check_memory(req)
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    sampler = TreeSampler(proc.pid)
    sampler.start()
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip())
        print(f"  [{time.monotonic() - t0:6.0f} s] {line.rstrip()}", flush=True)
    code = proc.wait()
    sampler.stop()
    wall = time.monotonic() - t0
    verdict = next((ln for ln in reversed(lines) if ln.startswith(("PASS", "FAIL"))), f"exit {code}")
    return {
        "layout": name,
        "exit": code,
        "wall_s": round(wall),
        "peak_rss_gib": sampler.peak_rss / GIB,
        "peak_anon_gib": sampler.peak_anon / GIB,
        "processes_at_peak": sampler.procs_at_peak,
        "copy_gib": est.copy_bytes / GIB,
        "estimate_gib": est.need_bytes / GIB,
        "rss_bound_gib": est.rss_bound / GIB,
        "ratio": sampler.peak_anon / est.need_bytes,
        "verdict": verdict,
        "engine_lines": [ln for ln in lines if ": max |diff|" in ln],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layouts", default="tp1", help=f"comma-separated, from {','.join(LAYOUTS)}")
    ap.add_argument("--build-only", action="store_true")
    ns = ap.parse_args()
    hf = synthetic_folder()
    if ns.build_only:
        return 0
    results = []
    work = CACHE / "work"
    work.mkdir(parents=True, exist_ok=True)
    for name in ns.layouts.split(","):
        r = run_layout(hf, name, work)
        results.append(r)
        print(
            f"{name}: peak summed RSS {r['peak_rss_gib']:.2f} GiB (bound {r['rss_bound_gib']:.2f}, "
            f"{r['processes_at_peak']} processes), peak summed RssAnon {r['peak_anon_gib']:.2f} GiB, estimate "
            f"{r['estimate_gib']:.2f} GiB, measured/estimate {r['ratio']:.2f}, one copy {r['copy_gib']:.2f} GiB, "
            f"wall {r['wall_s']} s, exit {r['exit']}: {r['verdict']}",
            flush=True,
        )
    print(json.dumps(results, indent=1))
    ok = all(r["exit"] == 0 and r["ratio"] <= 1.0 and r["peak_rss_gib"] <= r["rss_bound_gib"] for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
