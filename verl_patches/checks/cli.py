"""Arguments of `check_logprobs.py` and its exit status: 0 all engines within the tolerance, 1 a mismatch
(the engine and its worst token named), 2 a request, model folder or checkpoint that cannot be checked, or
any failure on the way (one line): 1 is never a crash."""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from verl_patches.base import env_registry
from verl_patches.base.env_flags import EnvError
from verl_patches.base.finite_float import float_arg
from verl_patches.base.strict_int import IntError, int_arg, parse_int
from verl_patches.checks.run import ENGINES, CheckRequest, CheckRequestError, run_check
from verl_patches.multirank import RankFailure
from verl_patches.weights.errors import WeightsError

EXIT_PASS, EXIT_MISMATCH, EXIT_ERROR = 0, 1, 2
TRACEBACK_ENV = "CHECK_LOGPROBS_TRACEBACK"  # set to 1 to see the traceback of an unexpected failure


def _layer_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(parse_int(x, "item", minimum=1) for x in text.split(","))
    except IntError:
        raise argparse.ArgumentTypeError(f"{text[:80]!r} is not a comma-separated list of positive integers") from None


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
        "exits 1 naming the engine and the worst token when one differs by more than --tolerance.",
    )
    p.add_argument("--hf", type=Path, required=True, help="HF BF16/FP32 model folder (the reference)")
    p.add_argument(
        "--mcore",
        type=Path,
        default=None,
        help="converted Megatron checkpoint; default: convert --hf into a temporary folder",
    )
    p.add_argument("--tp", type=int_arg(1, 1 << 16), default=1)
    p.add_argument("--pp", type=int_arg(1, 1 << 16), default=1)
    p.add_argument("--ep", type=int_arg(1, 1 << 16), default=1)
    p.add_argument("--num-layer-list", type=_layer_list, default=None, help="layers per pipeline stage, e.g. 2,3")
    p.add_argument(
        "--moe-tp-extend-ep",
        action="store_true",
        help="accepted as in the converter; the A3 engine always runs TP-extend-EP, so every checkpoint is checked "
        "(and converted) with it",
    )
    p.add_argument("--engines", type=_engines, default=ENGINES, help="megatron,rollout (default both)")
    p.add_argument(
        "--tokens", type=int_arg(1, 1 << 16), default=16, help="tokens per sequence (a quarter of them prompt)"
    )
    p.add_argument("--seed", type=int_arg(0), default=0, help="seed of the token ids")
    p.add_argument("--layers", type=int_arg(1), default=None, help="keep only the first K decoder layers")
    p.add_argument("--experts", type=int_arg(1), default=None, help="keep only the first M routed experts")
    p.add_argument("--rollout-tp", type=int_arg(1, 1 << 16), default=1)
    p.add_argument(
        "--rollout-ep",
        type=int_arg(1, 1 << 16),
        default=None,
        help="rollout EP size (default: all ranks, one instance)",
    )
    p.add_argument(
        "--tolerance",
        type=float_arg(above=0),
        default=None,
        help="max |log-prob difference| allowed (default 1e-3 in float32, 0.15 in bfloat16)",
    )
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="dtype of every engine and of the reference (auto: the one --hf's weights are stored in)",
    )
    p.add_argument(
        "--skip-memory-check",
        action="store_true",
        help="run even when the memory estimate exceeds the host's available memory",
    )
    p.add_argument("--timeout", type=float_arg(above=0), default=1800.0, help="seconds the ranks may take")
    p.add_argument("--work-dir", type=Path, default=None, help="where the temporary model folders go")
    return p


def request_from_args(ns: argparse.Namespace) -> CheckRequest:
    return CheckRequest(
        hf=ns.hf,
        mcore=ns.mcore,
        tp=ns.tp,
        pp=ns.pp,
        ep=ns.ep,
        num_layer_list=ns.num_layer_list,
        moe_tp_extend_ep=ns.moe_tp_extend_ep,
        engines=ns.engines,
        tokens=ns.tokens,
        seed=ns.seed,
        layers=ns.layers,
        experts=ns.experts,
        rollout_tp=ns.rollout_tp,
        rollout_ep=ns.rollout_ep,
        tolerance=ns.tolerance,
        dtype=ns.dtype,
        timeout_s=ns.timeout,
        skip_memory_check=ns.skip_memory_check,
    )


def _one_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    return lines[0][:500] if lines else type(err).__name__


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)  # bad usage: argparse exits 2
    if ns.work_dir is not None and not ns.work_dir.is_dir():
        print(f"check_logprobs: error: --work-dir {ns.work_dir}: not a folder", file=sys.stderr)
        return EXIT_ERROR
    try:
        show_traceback = env_registry.flag(TRACEBACK_ENV)  # read before the run: a bad value is said first, not last
    except EnvError as err:
        print(f"check_logprobs: error: {err}", file=sys.stderr)
        return EXIT_ERROR
    try:
        result = run_check(
            request_from_args(ns), log=lambda s: print(f"check_logprobs: {s}", flush=True), work_dir=ns.work_dir
        )
    except (CheckRequestError, WeightsError) as err:
        print(f"check_logprobs: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_ERROR
    except RankFailure as err:  # the rank's traceback is the evidence: kept after the one-line verdict
        print(
            f"check_logprobs: error: an engine rank failed (the check could not run; exit {EXIT_ERROR}, not a "
            f"mismatch):\n{err}",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("check_logprobs: interrupted", file=sys.stderr)
        return 130
    except Exception as err:  # noqa: BLE001 - any other failure is "could not check", never "log-probs differ"
        if show_traceback:
            traceback.print_exc()
        print(
            f"check_logprobs: error: the check failed ({type(err).__name__}: {_one_line(err)}); "
            f"{TRACEBACK_ENV}=1 shows the traceback",
            file=sys.stderr,
        )
        return EXIT_ERROR
    for line in result.lines:
        print(line, flush=True)
    return EXIT_PASS if result.ok else EXIT_MISMATCH
