#!/usr/bin/env python3
"""Convert the FP8 DeepSeek-V3 Hugging Face checkpoint to BF16, shard by shard (CPU only).

  python verl_patches/scripts/fp8_cast_bf16.py --input-fp8-hf-path /data/DeepSeek-V3 \\
      --output-bf16-hf-path /data/DeepSeek-V3-bf16 --workers 8

Writes BF16 shards with the input's file names, a model.safetensors.index.json without scale tensors, a
config.json without quantization_config, and copies the tokenizer files: the output directory is complete
as written (do not copy the FP8 index or config over it). Each worker holds about one tensor (at most
~1.9 GB for 671B). Re-running the same command resumes: finished shards whose size and sha256 match the
manifest are skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a file: make the repo importable

from verl_patches.base.tool_python import third_party_imports  # noqa: E402

with third_party_imports("fp8_cast_bf16.py"):  # another Python than requirements.txt's: one line, exit 2
    from verl_patches.base.strict_int import int_arg
    from verl_patches.weights.cli import run_cli
    from verl_patches.weights.fp8_cast import run_fp8_cast
    from verl_patches.weights.verify import verify_fp8_cast


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input-fp8-hf-path", required=True, metavar="DIR", help="FP8 checkpoint directory")
    p.add_argument("--output-bf16-hf-path", required=True, metavar="DIR", help="BF16 output directory")
    p.add_argument(
        "--workers",
        type=int_arg(1, 4096),
        default=min(8, os.cpu_count() or 1),
        help="shards converted in parallel (memory: about 2 GB each for 671B; default min(8, CPUs))",
    )
    p.add_argument(
        "--drop-mtp",
        action="store_true",
        help="leave out the MTP layer (model.layers.N for N >= num_hidden_layers) and set "
        "num_nextn_predict_layers to 0",
    )
    p.add_argument("--overwrite", action="store_true", help="ignore an existing output instead of resuming it")
    p.add_argument(
        "--verify",
        action="store_true",
        help="after converting, compare every tensor with the float32 reference (reads both checkpoints)",
    )
    p.add_argument("--verify-only", action="store_true", help="only verify an existing output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    progress = not args.no_progress

    def body() -> int:
        if not args.verify_only:
            t0 = time.perf_counter()
            r = run_fp8_cast(
                args.input_fp8_hf_path,
                args.output_bf16_hf_path,
                workers=args.workers,
                drop_mtp=args.drop_mtp,
                overwrite=args.overwrite,
                progress=progress,
            )
            dequantised = f"{r.tensors_dequantized} tensor(s) dequantised, {r.tensors_dropped} dropped"
            print(f"fp8->bf16: {r.summary(args.output_bf16_hf_path, time.perf_counter() - t0, dequantised)}")
        if args.verify or args.verify_only:
            v = verify_fp8_cast(
                args.input_fp8_hf_path, args.output_bf16_hf_path, workers=args.workers, progress=progress
            )
            print(
                f"verify: OK, all {v.input_tensors} input tensor(s) accounted for: {v.tensors_dequantized} "
                f"dequantised within BF16 rounding (max rel err {v.max_rel_err:.2e}), {v.tensors_exact} "
                f"bit-identical, {v.scales_consumed} scale(s) folded in, {v.dropped} dropped (MTP)"
            )
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
