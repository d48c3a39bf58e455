"""A role's per-rank files as two workers leave them in a step's folder, for the commit and trainer tests: each
rank's RNG file, then its record (`RankRecord`) naming that file's size and sha256, the last thing a rank writes."""

from __future__ import annotations

import json
from pathlib import Path

from verl_patches.checkpoint.manifest import RankRecord, TrainLayout, rank_record_name
from verl_patches.checkpoint.safe_load import sha256_file

LAYOUT = TrainLayout(tp=1, pp=1, ep=2, dp=2)  # the two ranks: one per expert-parallel group


def rng_rel(rank: int) -> str:
    return f"rng/rank_{rank:05d}.pt"


def rng_file(role: Path, rank: int) -> Path:
    """Where `rank` writes its RNG state in `role`, its folder made."""
    f = role / rng_rel(rank)
    f.parent.mkdir(parents=True, exist_ok=True)
    return f


def write_rank_record(role: Path, rank: int) -> None:
    """`rank`'s record of its RNG file as that file now is on disk."""
    rel = rng_rel(rank)
    digest = sha256_file(role / rel)
    record = RankRecord(
        rank=rank,
        layout=LAYOUT,
        tp_rank=0,
        pp_rank=0,
        ep_rank=rank,
        dp_rank=rank,
        files={rel: (role / rel).stat().st_size},
        sha256={rel: digest},
    )
    path = role / rank_record_name(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record.to_json()))
