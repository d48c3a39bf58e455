#!/usr/bin/env python3
"""DeepSeek-V3 checkpoints: HF BF16 -> legacy Megatron for MindSpeed-LLM, and back (--reverse).

  # HF -> Megatron, the A3 layout (flags as in MindSpeed-LLM's converter; dimensions come from config.json)
  python verl_patches/scripts/convert_ckpt_deepseek3.py --load-dir /data/DeepSeek-V3-bf16 \\
      --save-dir /data/dsv3-mcore --moe-grouped-gemm --target-tensor-parallel-size 4 \\
      --target-pipeline-parallel-size 8 --num-layer-list 7,7,8,8,8,8,8,7 \\
      --target-expert-parallel-size 8 --moe-tp-extend-ep --first-k-dense-replace 3 --num-layers 61

  # Megatron -> HF (layout and config are read from the converter's manifest when present)
  python verl_patches/scripts/convert_ckpt_deepseek3.py --reverse --load-dir /data/dsv3-mcore \\
      --save-dir /data/dsv3-hf-export --tokenizer-dir /data/DeepSeek-V3-bf16

Every flag is checked against config.json before any work. One rank (or output shard) is built at a
time from memory-mapped sources, so memory stays near one rank's share. Re-running the same command
resumes. --verify compares the result with its source tensor by tensor; --dry-run prints the plan
(per-rank sizes, disk, memory) without reading any weight.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: make the repo importable

from verl_patches.base.tool_python import third_party_imports  # noqa: E402

with third_party_imports("convert_ckpt_deepseek3.py"):  # another Python than requirements.txt's: one line, exit 2
    from verl_patches.base.finite_float import float_arg
    from verl_patches.base.strict_int import StepNumberError, int_arg, parse_step_int
    from verl_patches.weights.cli import run_cli
    from verl_patches.weights.config import load_config
    from verl_patches.weights.errors import LayoutError
    from verl_patches.weights.estimates import summarize_plan
    from verl_patches.weights.hf_to_mcore import convert_hf_to_mcore
    from verl_patches.weights.layout import ParallelLayout, parse_layer_list, validate_layout
    from verl_patches.weights.mcore_to_hf import convert_mcore_to_hf, resolve_layout_and_config
    from verl_patches.weights.verify import check_index_consistent, verify_hf_mcore_pair

# MindSpeed-LLM converter options this tool does not implement, with the reason given to the user.
_UNSUPPORTED = {
    "--num-layers-per-virtual-pipeline-stage": "virtual pipeline stages are not used by this recipe",
    "--noop-layers": "noop layers are not used by this recipe",
    "--mla-mm-split": "the recipe trains with fused linear_qb/linear_kvb",
    "--qlora-nf4": "QLoRA needs bitsandbytes on an NPU",
    "--num-nextn-predict-layers": "the training config has no MTP layer (num_nextn_predict_layers 0)",
    "--allow-pickle": "rank files are always loaded weights-only (tensors and plain data; never pickled code)",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--load-dir", required=True, help="source: HF BF16 model dir (or the Megatron dir with --reverse)")
    p.add_argument("--save-dir", required=True, help="destination directory")
    p.add_argument("--target-tensor-parallel-size", type=int_arg(1), default=None, help="TP size (default 1)")
    p.add_argument("--target-pipeline-parallel-size", type=int_arg(1), default=None, help="PP size (default 1)")
    p.add_argument("--target-expert-parallel-size", type=int_arg(1), default=None, help="EP size (default 1)")
    p.add_argument("--num-layer-list", default=None, help="layers per PP stage, e.g. 7,7,8,8,8,8,8,7")
    p.add_argument("--num-layers", type=int_arg(1), default=None, help="must equal num_hidden_layers of config.json")
    p.add_argument(
        "--first-k-dense-replace", type=int_arg(0), default=None, help="must equal first_k_dense_replace of config.json"
    )
    p.add_argument(
        "--moe-grouped-gemm",
        action="store_true",
        default=None,
        help="grouped-GEMM expert weights (experts.weight1/weight2)",
    )
    p.add_argument(
        "--moe-tp-extend-ep",
        action="store_true",
        default=None,
        help="split experts over EP x TP ranks instead of slicing them over TP",
    )
    p.add_argument("--reverse", action="store_true", help="Megatron -> HF instead of HF -> Megatron")
    p.add_argument(
        "--config",
        default=None,
        help="--reverse: config.json (or dir) of the model, needed when the checkpoint has no manifest",
    )
    p.add_argument("--tokenizer-dir", default=None, help="--reverse: copy tokenizer files from this directory")
    p.add_argument("--iteration", default=None, help="--reverse: iteration to export (default: the tracker's)")
    p.add_argument(
        "--max-shard-size-gb",
        type=float_arg(at_least=0.001, at_most=1024),
        default=5.0,
        help="--reverse: output shard size (default 5)",
    )
    p.add_argument(
        "--workers",
        type=int_arg(1, 4096),
        default=1,
        help="ranks converted in parallel (memory: one rank's share each; default 1)",
    )
    p.add_argument("--verify", action="store_true", help="after converting, compare every tensor with the source")
    p.add_argument("--verify-only", action="store_true", help="only verify an existing result")
    p.add_argument("--dry-run", action="store_true", help="print the plan (sizes, disk, memory) and exit")
    p.add_argument("--overwrite", action="store_true", help="ignore an existing result instead of resuming it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    for flag in _UNSUPPORTED:
        p.add_argument(
            flag,
            dest="unsupported_" + flag[2:].replace("-", "_"),
            nargs="?",
            const=True,
            default=None,
            help=argparse.SUPPRESS,
        )
    return p


def layout_from_args(args: argparse.Namespace, required: bool) -> ParallelLayout | None:
    given = [
        args.target_tensor_parallel_size,
        args.target_pipeline_parallel_size,
        args.target_expert_parallel_size,
        args.num_layer_list,
        args.moe_grouped_gemm,
        args.moe_tp_extend_ep,
    ]
    if not required and all(v is None for v in given):
        return None
    return ParallelLayout(
        tp=args.target_tensor_parallel_size or 1,
        pp=args.target_pipeline_parallel_size or 1,
        ep=args.target_expert_parallel_size or 1,
        num_layer_list=parse_layer_list(args.num_layer_list),
        moe_grouped_gemm=bool(args.moe_grouped_gemm),
        moe_tp_extend_ep=bool(args.moe_tp_extend_ep),
    )


def print_plan(cfg: dict, layout: ParallelLayout, workers: int) -> None:
    s = summarize_plan(cfg, layout)
    gb = 1e9
    print(
        f"layout: TP{layout.tp} PP{layout.pp} EP{layout.ep}, layers per stage {list(s.stage_layer_counts)}, "
        f"grouped GEMM {layout.moe_grouped_gemm}, TP-extend-EP {layout.moe_tp_extend_ep}"
    )
    print(
        f"ranks: {s.num_ranks}; largest rank {s.largest_rank} {s.max_rank_bytes / gb:.2f} GB; "
        f"smallest {s.min_rank_bytes / gb:.2f} GB"
    )
    print(f"disk: {s.total_bytes / gb:.1f} GB of Megatron checkpoint (source: {s.source_bytes / gb:.1f} GB)")
    print(f"memory: about {s.peak_rss_bytes(workers) / gb:.1f} GB peak RSS with --workers {workers}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag, why in _UNSUPPORTED.items():
        if getattr(args, "unsupported_" + flag[2:].replace("-", "_")) is not None:
            print(f"error: {flag} is not supported: {why}", file=sys.stderr)
            return 2
    progress = not args.no_progress

    def body() -> int:
        if args.reverse:
            layout = layout_from_args(args, required=False)
            config = load_config(args.config) if args.config else None
            layout, cfg = resolve_layout_and_config(Path(args.load_dir), layout, config)
            if args.dry_run:
                print_plan(cfg, layout, 1)
                return 0
            if not args.verify_only:
                it = args.iteration
                if it is not None and it != "release":
                    try:
                        it = parse_step_int(it, "--iteration")
                    except StepNumberError as err:
                        raise LayoutError(f"{err} or 'release'") from None
                t0 = time.perf_counter()
                r = convert_mcore_to_hf(
                    args.load_dir,
                    args.save_dir,
                    layout=layout,
                    config=cfg,
                    iteration=it,
                    max_shard_bytes=int(args.max_shard_size_gb * 1024**3),
                    tokenizer_dir=args.tokenizer_dir,
                    overwrite=args.overwrite,
                    progress=progress,
                )
                print(f"mcore->hf: {r.summary(args.save_dir, time.perf_counter() - t0)}")
            hf_dir, mcore_dir = args.save_dir, args.load_dir
        else:
            cfg = load_config(args.load_dir)
            layout = layout_from_args(args, required=True)
            validate_layout(layout, cfg, args.num_layers, args.first_k_dense_replace)
            if args.dry_run:
                print_plan(cfg, layout, args.workers)
                return 0
            if not args.verify_only:
                t0 = time.perf_counter()
                r = convert_hf_to_mcore(
                    args.load_dir,
                    args.save_dir,
                    layout,
                    num_layers=args.num_layers,
                    first_k_dense_replace=args.first_k_dense_replace,
                    overwrite=args.overwrite,
                    workers=args.workers,
                    progress=progress,
                )
                print(f"hf->mcore: {r.summary(args.save_dir, time.perf_counter() - t0)}")
            hf_dir, mcore_dir = args.load_dir, args.save_dir
        if args.verify or args.verify_only:
            if args.reverse:
                check_index_consistent(Path(hf_dir))
            v = verify_hf_mcore_pair(hf_dir, mcore_dir, layout, cfg, progress=progress)
            print(
                f"verify: OK, all {v.hf_tensors} tensor(s) of the HF checkpoint reassembled from the ranks and "
                f"{v.rank_tensors} rank tensor(s) derived from HF, bit-identical"
            )
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
