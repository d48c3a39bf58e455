"""Arguments of `check_logprobs.py` and its exit status: 0 all engines within the tolerance, 1 a mismatch
(the engine and its worst token named), 2 a request or checkpoint that cannot be checked (one line)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_patches.checks.run import ENGINES, CheckRequest, CheckRequestError, run_check


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None


def _engines(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [n for n in names if n not in ENGINES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(ENGINES)}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="check_logprobs.py",
        description="Per-token log-probs of the same sequences from HF transformers (the reference), the "
                    "Megatron engine (verl's worker, the A3 loading code) and the rollout after a weight sync; "
                    "exits 1 naming the engine and the worst token when one differs by more than --tolerance.")
    p.add_argument("--hf", type=Path, required=True, help="HF BF16/FP32 model folder (the reference)")
    p.add_argument("--mcore", type=Path, default=None,
                   help="converted Megatron checkpoint; default: convert --hf into a temporary folder")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--num-layer-list", type=_layer_list, default=None, help="layers per pipeline stage, e.g. 2,3")
    p.add_argument("--moe-tp-extend-ep", action="store_true", help="accepted as in the converter; the A3 engine always runs TP-extend-EP, so every checkpoint is checked (and converted) with it")
    p.add_argument("--engines", type=_engines, default=ENGINES, help="megatron,rollout (default both)")
    p.add_argument("--tokens", type=int, default=16, help="tokens per sequence (a quarter of them prompt)")
    p.add_argument("--seed", type=int, default=0, help="seed of the token ids")
    p.add_argument("--layers", type=int, default=None, help="keep only the first K decoder layers")
    p.add_argument("--experts", type=int, default=None, help="keep only the first M routed experts")
    p.add_argument("--rollout-tp", type=int, default=1)
    p.add_argument("--rollout-ep", type=int, default=None, help="rollout EP size (default: all ranks, one instance)")
    p.add_argument("--tolerance", type=float, default=None,
                   help="max |log-prob difference| allowed (default 1e-3 in float32, 0.15 in bfloat16)")
    p.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                   help="dtype of every engine and of the reference (auto: the one --hf's weights are stored in)")
    p.add_argument("--skip-memory-check", action="store_true",
                   help="run even when the memory estimate exceeds the host's available memory")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds the ranks may take")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temporary model folders go")
    return p


def request_from_args(ns: argparse.Namespace) -> CheckRequest:
    return CheckRequest(hf=ns.hf, mcore=ns.mcore, tp=ns.tp, pp=ns.pp, ep=ns.ep, num_layer_list=ns.num_layer_list,
                        moe_tp_extend_ep=ns.moe_tp_extend_ep, engines=ns.engines, tokens=ns.tokens, seed=ns.seed,
                        layers=ns.layers, experts=ns.experts, rollout_tp=ns.rollout_tp, rollout_ep=ns.rollout_ep,
                        tolerance=ns.tolerance, dtype=ns.dtype, timeout_s=ns.timeout,
                        skip_memory_check=ns.skip_memory_check)


def main(argv: list[str] | None = None) -> int:
    from verl_patches.checks.launch import RankFailure
    from verl_patches.weights.errors import WeightsError

    ns = build_parser().parse_args(argv)
    try:
        result = run_check(request_from_args(ns), log=lambda s: print(f"check_logprobs: {s}", flush=True),
                           work_dir=ns.work_dir)
    except (CheckRequestError, WeightsError) as err:
        print(f"check_logprobs: error: {err}", file=sys.stderr)
        return 2
    except RankFailure as err:
        print(f"check_logprobs: an engine rank failed:\n{err}", file=sys.stderr)
        return 2
    for line in result.lines:
        print(line, flush=True)
    return 0 if result.ok else 1
