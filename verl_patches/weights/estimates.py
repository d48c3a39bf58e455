"""Disk and memory a HF -> Megatron conversion needs, from the config and layout alone.

Sizes are exact (the rank state dicts are planned on the ``meta`` device). The memory model, measured
by ``bench/bench_convert_memory.py`` on synthetic DeepSeek-V3-shaped checkpoints, is per converting
process: interpreter + fixed costs (``PROCESS_RSS``) + the rank's tensors + source pages still mapped
(at most the remap interval). With ``--workers N`` the parent adds one more ``PROCESS_RSS``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_patches.weights.hf_schema import hf_tensor_specs
from verl_patches.weights.hf_to_mcore import rank_sizes
from verl_patches.weights.layout import ParallelLayout, rank_dir_name, stage_layer_counts
from verl_patches.weights.st_reader import DEFAULT_REMAP_BYTES

PROCESS_RSS = 350 * 1024**2  # python, torch, safetensors, meta planning, torch.save: measured 227 + 114 MiB


@dataclass(frozen=True)
class PlanSummary:
    num_ranks: int
    stage_layer_counts: tuple[int, ...]
    largest_rank: str
    max_rank_bytes: int
    min_rank_bytes: int
    total_bytes: int
    source_bytes: int

    def peak_rss_bytes(self, workers: int = 1) -> int:
        per_worker = PROCESS_RSS + self.max_rank_bytes + DEFAULT_REMAP_BYTES
        return per_worker if workers <= 1 else PROCESS_RSS + workers * per_worker


def summarize_plan(cfg: Mapping[str, Any], layout: ParallelLayout) -> PlanSummary:
    sizes = {rank_dir_name(layout, r): n for r, n in rank_sizes(cfg, layout).items()}
    largest = max(sizes, key=sizes.__getitem__)
    return PlanSummary(
        num_ranks=len(sizes),
        stage_layer_counts=stage_layer_counts(layout, cfg["num_hidden_layers"]),
        largest_rank=largest,
        max_rank_bytes=sizes[largest],
        min_rank_bytes=min(sizes.values()),
        total_bytes=sum(sizes.values()),
        source_bytes=sum(s.nbytes for s in hf_tensor_specs(cfg)),
    )
