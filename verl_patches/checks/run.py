"""The whole check: prepare the (truncated) model folders, score the sequences with HF, launch the engines'
ranks, compare, report.

Model folders the engines read (all in a temporary folder, removed afterwards):
- HF: ``--hf`` itself, or its first ``--layers`` layers / ``--experts`` experts (`truncate.truncate_hf`).
- Megatron: ``--mcore`` as it is (its converter manifest must name the check's layout); with ``--layers`` or
  ``--experts``, the same slice read out of ``--mcore`` by the reverse converter and converted again to the
  check's layout; without ``--mcore``, the HF folder converted by our converter.
"""

from __future__ import annotations

import ctypes
import gc
import math
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from verl_patches.checkpoint.safe_load import load_tensor_file
from verl_patches.checks import memory  # its available_bytes is read at call time (tests replace it)
from verl_patches.checks.compare import EngineDiff, compare, verdict
from verl_patches.checks.engine_ranks import prepare_rank, rank_check
from verl_patches.checks.inputs import CheckRequestError, check_inputs
from verl_patches.checks.memory import DTYPES, GIB, checkpoint_dtype, estimate_memory, fit_problem
from verl_patches.checks.reference import hf_log_probs
from verl_patches.checks.sequences import make_sequences, sequence_shape
from verl_patches.device import dist_backend
from verl_patches.multirank import run_ranks
from verl_patches.weights.config import load_config
from verl_patches.weights.errors import LayoutError
from verl_patches.weights.layout import ParallelLayout
from verl_patches.weights.manifest_file import read_conversion_manifest

if TYPE_CHECKING:
    from verl_patches.checks.memory import MemoryEstimate

ENGINES = ("megatron", "rollout")
MAX_TOKENS = 1 << 16


@dataclass(frozen=True)
class CheckRequest:
    hf: Path
    mcore: Path | None = None
    tp: int = 1
    pp: int = 1
    ep: int = 1
    num_layer_list: tuple[int, ...] | None = None
    moe_tp_extend_ep: bool = False
    engines: tuple[str, ...] = ENGINES
    tokens: int = 16
    seed: int = 0
    layers: int | None = None
    experts: int | None = None
    rollout_tp: int = 1
    rollout_ep: int | None = None  # default: the whole world (one rollout instance)
    tolerance: float | None = None  # default: 1e-3 in float32, 0.15 in bfloat16 (`default_tolerance`)
    dtype: str = "auto"  # auto: the dtype the --hf weights are stored in
    timeout_s: float = 1200.0
    skip_memory_check: bool = False

    @property
    def world(self) -> int:
        """One data-parallel rank per expert-parallel rank: the smallest world holding the layout."""
        return self.tp * self.pp * self.ep

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def rollout_ep_size(self) -> int:
        return self.rollout_ep if self.rollout_ep is not None else self.world


@dataclass
class CheckResult:
    ok: bool
    lines: list[str]
    diffs: list[EngineDiff] = field(default_factory=list)


def validate_request(req: CheckRequest) -> None:
    for flag, v in (
        ("--tp", req.tp),
        ("--pp", req.pp),
        ("--ep", req.ep),
        ("--rollout-tp", req.rollout_tp),
        ("--rollout-ep", req.rollout_ep_size),
        ("--tokens", req.tokens),
    ):
        if not isinstance(v, int) or v < 1:
            raise CheckRequestError(f"{flag} must be a positive integer, got {v!r}")
    bad = [e for e in req.engines if e not in ENGINES]
    if bad or not req.engines:
        raise CheckRequestError(f"--engines {','.join(req.engines)}: choose from {','.join(ENGINES)}")
    if req.world % req.rollout_ep_size:
        raise CheckRequestError(
            f"--rollout-ep {req.rollout_ep_size} does not divide the {req.world} ranks "
            f"(tp*pp*ep = {req.tp}*{req.pp}*{req.ep})"
        )
    if req.rollout_ep_size % req.rollout_tp:
        raise CheckRequestError(
            f"--rollout-tp {req.rollout_tp} does not divide --rollout-ep {req.rollout_ep_size} "
            f"(an EP instance is rollout TP x VLLM_DP_SIZE ranks)"
        )
    if req.num_layer_list is not None and len(req.num_layer_list) != req.pp:
        raise CheckRequestError(f"--num-layer-list has {len(req.num_layer_list)} entries, --pp is {req.pp}")
    if req.tolerance is not None and not 0 < req.tolerance < math.inf:
        raise CheckRequestError(f"--tolerance must be a positive number, got {req.tolerance!r}")
    if not 0 < req.timeout_s < math.inf:
        raise CheckRequestError(f"--timeout must be a positive number of seconds, got {req.timeout_s!r}")
    if req.tokens > MAX_TOKENS:
        raise CheckRequestError(f"--tokens {req.tokens}: at most {MAX_TOKENS} (the check scores short sequences)")
    for flag, v in (("--layers", req.layers), ("--experts", req.experts)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise CheckRequestError(f"{flag} must be a positive integer, got {v!r}")
    if req.dtype not in ("auto", "float32", "bfloat16"):
        raise CheckRequestError(f"--dtype {req.dtype!r}: auto, float32 or bfloat16")


def default_tolerance(dtype: str) -> float:
    return 1e-3 if dtype == "float32" else 0.15


def engine_dtype(req: CheckRequest, stored: torch.dtype) -> str:
    """The dtype every engine and the reference compute in: --dtype, or with auto the weights' own (a real
    checkpoint's bf16 is never upcast unless asked)."""
    if req.dtype != "auto":
        return req.dtype
    names = {torch.float32: "float32", torch.bfloat16: "bfloat16"}
    if stored not in names:
        raise CheckRequestError(
            f"--dtype auto: {req.hf} stores its weights as {stored}; give --dtype float32 or --dtype bfloat16"
        )
    return names[stored]


def estimate_check_memory(req: CheckRequest, stored: torch.dtype | None = None) -> MemoryEstimate:
    """The check's memory estimate (`verl_patches.checks.memory`) from --hf's config.json and the flags."""

    stored = stored if stored is not None else checkpoint_dtype(req.hf)
    truncating = req.layers is not None or req.experts is not None
    return estimate_memory(
        load_config(req.hf),
        layers=req.layers,
        experts=req.experts,
        layout=_layout(req),
        world=req.world,
        rollout_ep=req.rollout_ep_size,
        engine_dtype=DTYPES[engine_dtype(req, stored)],
        checkpoint_dtype=stored,
        convert=req.mcore is None or truncating,
        engines=req.engines,
        tokens=req.tokens,
        batch=sequence_shape(req.tokens, req.dp).batch,
    )


def check_memory(req: CheckRequest, log: Callable[[str], None]) -> str:
    """Print the estimate and refuse (naming the flags to change) when it exceeds the host's available
    memory; returns the engines' dtype."""
    stored = checkpoint_dtype(req.hf)
    dtype = engine_dtype(req, stored)
    est = estimate_check_memory(req, stored)
    for line in est.lines():
        log(line)
    problem = fit_problem(est, memory.available_bytes(), layers=req.layers, experts=req.experts, dtype=DTYPES[dtype])
    if problem and not req.skip_memory_check:
        raise CheckRequestError(problem)
    if problem:
        log(f"warning (--skip-memory-check): {problem}")
    return dtype


def _release_freed_memory() -> None:
    """Give the freed reference model back to the OS before the ranks start (glibc keeps freed small blocks)."""

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _layout(req: CheckRequest):
    # the A3 engine always runs grouped GEMM with MindSpeed's TP-extend-EP (D1) and its loader refuses any
    # other layout, so the check converts to that layout whatever --moe-tp-extend-ep says
    return ParallelLayout(
        tp=req.tp, pp=req.pp, ep=req.ep, num_layer_list=req.num_layer_list, moe_grouped_gemm=True, moe_tp_extend_ep=True
    )


def prepare_models(req: CheckRequest, work: Path, log: Callable[[str], None]) -> tuple[Path, Path]:
    """(HF folder, Megatron folder) every engine reads, both the same (truncated) model."""
    # lazy: that module loads safetensors; importing this one must not
    from verl_patches.checks.truncate import truncate_hf, truncate_mcore_to_hf

    # lazy: that module loads safetensors, tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import MANIFEST_FILE, convert_hf_to_mcore

    truncating = req.layers is not None or req.experts is not None
    hf = req.hf
    if truncating:
        log(f"truncating {req.hf} to layers={req.layers or 'all'} experts={req.experts or 'all'}")
        hf = truncate_hf(req.hf, work / "hf", req.layers, req.experts)
    layout = _layout(req)
    if req.mcore is None:
        log(f"converting {hf} to the Megatron layout {layout.to_json()}")
        convert_hf_to_mcore(hf, work / "mcore", layout, progress=False)
        return hf, work / "mcore"
    if truncating:
        log(f"reading the same slice out of {req.mcore} and converting it to the layout {layout.to_json()}")
        sliced = truncate_mcore_to_hf(req.mcore, work / "mcore_hf", req.layers, req.experts, tokenizer_dir=req.hf)
        convert_hf_to_mcore(sliced, work / "mcore", layout, progress=False)
        return hf, work / "mcore"
    man = read_conversion_manifest(req.mcore, MANIFEST_FILE)
    if man is not None and man.layout != layout:
        raise LayoutError(
            f"{req.mcore}: converted with layout {man.layout.to_json()}, the check runs the A3 engine's "
            f"{layout.to_json()}; give the --tp/--pp/--ep/--num-layer-list it was converted with "
            f"(the A3 engine needs --moe-tp-extend-ep --moe-grouped-gemm conversions)"
        )
    return hf, req.mcore


def _load_tensor(path: Path) -> torch.Tensor:
    """A rank's result file, read weights-only (`checkpoint.safe_load`): tensors, never pickled code."""

    t = load_tensor_file(path)
    if not isinstance(t, torch.Tensor):
        raise RuntimeError(f"{path}: expected a tensor of log-probs, found {type(t).__name__}")
    return t


def collect(req: CheckRequest, out_dir: Path, dp: int) -> dict[str, torch.Tensor]:
    """The engines' log-probs as written by the ranks (Megatron's data-parallel shares in order)."""
    got = {}
    if "megatron" in req.engines:
        parts = []
        for d in range(dp):
            p = out_dir / f"megatron_dp{d}.pt"
            if not p.is_file():
                raise RuntimeError(f"megatron: data-parallel rank {d} wrote no log-probs ({p})")
            parts.append(_load_tensor(p))
        got["megatron"] = torch.cat(parts)
    if "rollout" in req.engines:
        got["rollout"] = _load_tensor(out_dir / "rollout.pt")
    return got


RANK_PEAKS = "measured peak RSS of each rank (VmHWM):"


def rank_peaks_line(peaks: list[int]) -> str:
    """Each rank's RSS high-water mark in bytes (so it can be compared exactly with the estimate)."""
    return RANK_PEAKS + "".join(f" rank{r} {b} B ({b / GIB:.2f} GiB)," for r, b in enumerate(peaks)).rstrip(",")


def run_check(req: CheckRequest, log: Callable[[str], None] = print, work_dir: Path | None = None) -> CheckResult:
    validate_request(req)
    check_inputs(req.hf, req.mcore)  # tokenizer, tensors, dtypes, sizes: before any conversion or rank
    dtype_name = check_memory(req, log)
    tolerance = req.tolerance if req.tolerance is not None else default_tolerance(dtype_name)
    with tempfile.TemporaryDirectory(prefix="check_logprobs_", dir=work_dir) as tmp:
        work = Path(tmp)
        hf, mcore = prepare_models(req, work, log)
        cfg = load_config(hf)
        shape = sequence_shape(req.tokens, req.dp)
        batch = make_sequences(shape, cfg["vocab_size"], req.seed)
        torch.save(batch, work / "batch.pt")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
        log(
            f"reference: HF transformers on {shape.batch} sequences of {shape.total} tokens "
            f"({shape.response} scored each), {dtype_name}"
        )
        reference = hf_log_probs(hf, batch, dtype)
        _release_freed_memory()
        (work / "out").mkdir()
        log(
            f"engines {','.join(req.engines)}: {req.world} ranks (TP{req.tp} PP{req.pp} EP{req.ep}, "
            f"rollout TP{req.rollout_tp} EP{req.rollout_ep_size})"
        )
        ranks = run_ranks(
            rank_check,
            req.world,
            req.timeout_s,
            backend=dist_backend(),
            preload=("verl_patches.prelude_patch",),
            setup=prepare_rank,
            kwargs=dict(
                hf_dir=str(hf),
                mcore_dir=str(mcore),
                tp=req.tp,
                pp=req.pp,
                ep=req.ep,
                layer_list=list(req.num_layer_list) if req.num_layer_list else None,
                engines=list(req.engines),
                rollout_tp=req.rollout_tp,
                rollout_ep=req.rollout_ep_size,
                batch_file=str(work / "batch.pt"),
                out_dir=str(work / "out"),
                dtype=dtype_name,
            ),
        )
        got = collect(req, work / "out", req.dp)
    peaks = [r.get("peak_rss") for r in ranks]
    if all(isinstance(b, int) and b > 0 for b in peaks):
        log(rank_peaks_line(peaks))
    diffs = [compare(name, reference, lp, batch["input_ids"]) for name, lp in got.items()]
    ok, lines = verdict(diffs, tolerance)
    return CheckResult(ok, lines, diffs)
