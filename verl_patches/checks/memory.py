"""How much memory `check_logprobs` needs, from the HF config and the request alone (pure), and the refusal
when the host does not have it.

The check runs in phases; only the engine ranks run side by side:

1. ``truncate`` (main process): one tensor at a time (read + clone of the largest one).
2. ``convert`` (main): the converter holds one Megatron rank's state dict (checkpoint dtype) plus up to
   ``DEFAULT_REMAP_BYTES`` of mapped source pages (`verl_patches.weights.estimates`).
3. ``reference`` (main): HF transformers' model in the engines' dtype, plus the pages of the memory-mapped
   safetensors it was loaded from (they count in RSS while resident), plus the logits. Freed (and given back
   to the OS, `run._release_freed_memory`) before the ranks start.
4. the engine ranks (main idle next to them), in lockstep (the sync and the gather are collectives):
   - ``engines: load``: each rank's Megatron parameters + its memory-mapped rank file (strict copy into
     the model);
   - ``engines: sync``: each rank's Megatron parameters + its rollout stand-in (the non-expert weights +
     its rollout-EP share of experts; built on the meta device and allocated once, so exactly one copy)
     + one MoE layer's experts for the sync's buffers;
   - ``engines: gather`` (rollout EP > 1, after the Megatron model is freed): rank 0 holds its stand-in,
     the whole EP-1 instance and every expert twice (pickled by ``gather_object`` and unpickled); the
     others their stand-in and their experts twice.

So at most two full copies of (a rank's share of) the slice exist at once: the Megatron model and the
stand-in. Process baselines (interpreter, torch, Megatron/MindSpeed/verl/vLLM imports) are constants
measured on this project's CPU host (`bench/bench_check_logprobs_memory.py`, `tests/checks/test_check_memory.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.layout import all_ranks

MIB = 1024**2
GIB = 1024**3
# process baselines on requirements.txt's stack (torch 2.5.1): the main process as before (measured 261 MiB
# anonymous, 377 MiB RSS); a rank measured about 1.2 GiB anonymous at the check's peak (tests/checks/
# test_check_memory_bound.py at EP1 and EP2: 0.55 GiB per rank above the 650 MiB calibrated on torch 2.13;
# its imports alone are 484 MiB, vLLM now importing vllm-ascend's models through its general plugin)
MAIN_PROCESS_BYTES = 400 * MIB  # python + torch + transformers + safetensors + the converter's imports
RANK_PROCESS_BYTES = 1280 * MIB  # + Megatron, MindSpeed(-LLM), verl, vLLM + vllm-ascend, the torch_npu emulation, gloo
LIBRARY_PAGES_BYTES = 544 * MIB  # shared libraries' file pages in a process's RSS (torch 2.5.1: 0.27 GiB more per rank)
HEADROOM = 1.05  # on model bytes: allocator slack, small tensors, the short sequences' activations
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Usage:
    """One process at a phase's peak: ``anon`` bytes it allocated, ``mapped`` bytes of memory-mapped files
    (checkpoints, shared libraries) resident in it (they count in its RSS; the kernel can drop them)."""

    process: str
    anon: int
    mapped: int = 0

    @property
    def rss(self) -> int:
        return self.anon + self.mapped


@dataclass(frozen=True)
class Phase:
    name: str
    usage: tuple[Usage, ...]

    @property
    def rss(self) -> int:
        return sum(u.rss for u in self.usage)

    @property
    def anon(self) -> int:
        return sum(u.anon for u in self.usage)


@dataclass(frozen=True)
class MemoryEstimate:
    copy_bytes: int  # one copy of the truncated slice in the engines' dtype
    phases: tuple[Phase, ...]

    @property
    def peak(self) -> Phase:
        """The phase needing the most memory that cannot be reclaimed (what must fit in the host)."""
        return max(self.phases, key=lambda p: p.anon)

    @property
    def need_bytes(self) -> int:
        """Peak of the summed anonymous memory of the check's processes."""
        return self.peak.anon

    @property
    def rss_bound(self) -> int:
        """Peak of the summed RSS (mapped checkpoint pages included) of the check's processes."""
        return max(p.rss for p in self.phases)

    def lines(self) -> list[str]:
        out = [
            f"memory estimate: one copy of the slice {self.copy_bytes / GIB:.2f} GiB; the check needs "
            f"{self.need_bytes / GIB:.2f} GiB at its peak (phase '{self.peak.name}', "
            f"{self.need_bytes / self.copy_bytes:.1f}x a copy with the process baselines); summed RSS with "
            f"memory-mapped checkpoint pages at most {self.rss_bound / GIB:.2f} GiB"
        ]
        for ph in self.phases:
            procs = ", ".join(
                f"{u.process} {u.anon / GIB:.2f}" + (f" + {u.mapped / GIB:.2f} mapped" if u.mapped else "")
                for u in ph.usage
            )
            out.append(f"  {ph.name}: {ph.anon / GIB:.2f} GiB ({procs})")
        return out


def _elem(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def _megatron_rank_bytes(cfg: Mapping[str, Any], layout: Any, dtype: torch.dtype) -> list[int]:
    # lazy: that module loads safetensors, tqdm; importing this one must not
    from verl_patches.weights.hf_to_mcore import meta_source, plan_rank_shapes

    meta = meta_source(cfg, dtype)
    # Python integers: a product of sizes never overflows (the config's sizes are bounded by its validation)
    return [
        sum(math.prod(s) * _elem(d) for s, d in plan_rank_shapes(cfg, layout, r, meta).values())
        for r in all_ranks(layout)
    ]


def _expert_layer_bytes(cfg: Mapping[str, Any], dtype: torch.dtype) -> int:
    """Bytes of the routed experts of one MoE layer (what one sync step holds at most)."""

    per_layer: dict[str, int] = {}
    for s in hf_tensor_specs(cfg, dtype):
        if _is_expert(s.name):
            layer = s.name.split(".")[2]
            per_layer[layer] = per_layer.get(layer, 0) + s.nbytes
    return max(per_layer.values(), default=0)


def estimate_memory(
    cfg: Mapping[str, Any],
    *,
    layers: int | None,
    experts: int | None,
    layout: Any,
    world: int,
    rollout_ep: int,
    engine_dtype: torch.dtype,
    checkpoint_dtype: torch.dtype,
    convert: bool,
    engines: tuple[str, ...],
    tokens: int,
    batch: int,
) -> MemoryEstimate:
    """Peak bytes per phase and process of a check of ``cfg`` (the source HF config) cut to ``layers`` /
    ``experts``; ``layout`` is the Megatron `ParallelLayout` of the ``world`` ranks."""
    # lazy: that module loads safetensors; importing this one must not
    from verl_patches.checks.truncate import truncated_config
    from verl_patches.weights.st_reader import DEFAULT_REMAP_BYTES

    tcfg = truncated_config(cfg, layers, experts)
    specs = hf_tensor_specs(tcfg, engine_dtype)
    copy = sum(s.nbytes for s in specs)
    expert_bytes = sum(s.nbytes for s in specs if _is_expert(s.name))
    dense_bytes = copy - expert_bytes
    ck = _elem(checkpoint_dtype) / _elem(engine_dtype)
    largest = max(s.nbytes for s in specs)
    main = MAIN_PROCESS_BYTES

    phases = []
    if layers is not None or experts is not None:
        phases.append(
            Phase("truncate", (Usage("main", int(main + largest * ck), int(DEFAULT_REMAP_BYTES + largest * ck)),))
        )
    if convert:
        ranks_ck = _megatron_rank_bytes(tcfg, layout, checkpoint_dtype)
        phases.append(Phase("convert", (Usage("main", main + max(ranks_ck), DEFAULT_REMAP_BYTES + int(largest * ck)),)))
    logits = batch * tokens * tcfg["vocab_size"] * 4 * 3  # logits, fp32 log-softmax, a temporary
    phases.append(Phase("reference", (Usage("main", main + copy + logits, int(copy * ck)),)))

    mg = _megatron_rank_bytes(tcfg, layout, engine_dtype)
    n_exp = tcfg["n_routed_experts"]
    share = -(-n_exp // rollout_ep)
    rollout = "rollout" in engines
    standin = dense_bytes + expert_bytes * share // n_exp if rollout else 0
    sync_buf = _expert_layer_bytes(tcfg, engine_dtype) if rollout else 0
    # the ranks move through the engine steps in lockstep (the sync and the gather are collectives), so
    # each step is a phase with every rank in it
    load, sync, gather = [Usage("main", main)], [Usage("main", main)], [Usage("main", main)]
    for r in range(world):
        m = mg[r]
        load.append(Usage(f"rank{r}", RANK_PROCESS_BYTES + m, int(m * ck)))
        sync.append(Usage(f"rank{r}", RANK_PROCESS_BYTES + m + standin + sync_buf))
        held = copy + 2 * expert_bytes if r == 0 else 2 * expert_bytes * share // n_exp
        gather.append(Usage(f"rank{r}", RANK_PROCESS_BYTES + standin + held))
    phases.append(Phase("engines: load", tuple(load)))
    if rollout:
        phases.append(Phase("engines: sync", tuple(sync)))
        if rollout_ep > 1:
            phases.append(Phase("engines: gather", tuple(gather)))

    def slack(u: Usage) -> Usage:
        base = MAIN_PROCESS_BYTES if u.process == "main" else RANK_PROCESS_BYTES
        return Usage(u.process, base + int((u.anon - base) * HEADROOM), u.mapped + LIBRARY_PAGES_BYTES)

    return MemoryEstimate(copy, tuple(Phase(p.name, tuple(slack(u) for u in p.usage)) for p in phases))


def fit_problem(
    est: MemoryEstimate, available: int, *, layers: int | None, experts: int | None, dtype: torch.dtype
) -> str | None:
    """None when the estimate fits in ``available`` bytes; else one message naming the flags to change."""
    if est.need_bytes <= available:
        return None
    hints = []
    if dtype == torch.float32:
        hints.append("--dtype bfloat16 (halves every copy)")
    hints.append(f"fewer layers (--layers, now {layers or 'all'})")
    hints.append(f"fewer routed experts (--experts, now {experts or 'all'})")
    return (
        f"the check needs about {est.need_bytes / GIB:.1f} GiB at its peak (phase '{est.peak.name}', one copy "
        f"of the slice is {est.copy_bytes / GIB:.1f} GiB) but this host has {available / GIB:.1f} GiB available; "
        f"use {', '.join(hints)}, or a host with more memory (--skip-memory-check runs it anyway)"
    )


def available_bytes() -> int:
    """MemAvailable of this host (what can be allocated without swapping)."""
    # lazy: only this path needs psutil; importing this module stays light
    import psutil

    return int(psutil.virtual_memory().available)


def checkpoint_dtype(hf_dir: Any) -> torch.dtype:
    """The dtype the HF folder's weights are stored in (that of its embedding)."""

    # lazy: that module loads safetensors; importing this one must not
    from verl_patches.weights.st_reader import CheckpointIndex, read_header

    index = CheckpointIndex.load(Path(hf_dir))
    name = "model.embed_tokens.weight"
    return read_header(index.root / index.file_of(name))[name][0]
