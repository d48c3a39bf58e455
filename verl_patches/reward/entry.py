"""verl `custom_reward_function` entry: deepscaler here, every other data source to verl unchanged.

verl v0.4.0 loads this file by path (`custom_reward_function.path`) under the module name
`custom_module` and calls `custom_reward_function.name` with `reward_kwargs` appended. So instead of
copying a router over `verl/utils/reward_score/__init__.py` (the vendor's approach, which broke
other data sources), this file routes:

    custom_reward_function.path=$PWD/verl_patches/reward/entry.py
    custom_reward_function.name=compute_score            # NaiveRewardManager (default)
    # or, one call per training step with worker processes:
    reward_model.reward_manager=batch custom_reward_function.name=compute_score_batch
    # optional: +custom_reward_function.reward_kwargs.timeout_s=2.0
    # format rule: custom_reward_function.reward_kwargs.format_rule=strict (default) | relaxed

Only `timeout_s`, `num_workers`, `memory_limit_mb` and `format_rule` are ours; other reward kwargs are
passed on to verl's `default_compute_score` untouched. `format_rule=strict` is DeepScaleR's and
R1-Zero's rule (no `</think>`, or no `\\boxed{}` after it: 0); `relaxed` grades responses without think
tags as a whole and accepts a marked unboxed final answer (for other prompt templates).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DEEPSCALER = "deepscaler"
_OUR_KWARGS = ("timeout_s", "num_workers", "memory_limit_mb", "format_rule")


def _split_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    ours = {k: v for k, v in kwargs.items() if k in _OUR_KWARGS}
    theirs = {k: v for k, v in kwargs.items() if k not in _OUR_KWARGS}
    return ours, theirs


def _deepscaler():
    # Loaded by file path, this module may run where the repo root is not on sys.path (a Ray worker
    # started from another directory); the package lives two levels above this file.
    if importlib.util.find_spec("verl_patches") is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    # deferred: importable only once the lines above put the repo root on sys.path
    from verl_patches.reward import deepscaler

    return deepscaler


def compute_score(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None, **kwargs: Any) -> Any:
    """verl NaiveRewardManager signature; deepscaler gets our strict reward, others verl's."""
    ours, theirs = _split_kwargs(kwargs)
    if data_source == DEEPSCALER:
        return _deepscaler().compute_score(data_source, solution_str, ground_truth, extra_info, **ours)
    # deferred: importing this module must not load verl; it loads once the prelude patched it
    from verl.utils.reward_score import default_compute_score

    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **theirs)


def compute_score_batch(
    data_sources: Sequence[Any],
    solution_strs: Sequence[Any],
    ground_truths: Sequence[Any],
    extra_infos: Sequence[Any] | None = None,
    **kwargs: Any,
) -> list[Any]:
    """verl BatchRewardManager signature; deepscaler items are graded together across processes."""
    ours, theirs = _split_kwargs(kwargs)
    extra_infos = list(extra_infos) if extra_infos is not None else [None] * len(solution_strs)
    scores: list[Any] = [None] * len(solution_strs)
    mine = [i for i, source in enumerate(data_sources) if source == DEEPSCALER]
    if mine:
        graded = _deepscaler().compute_score_batch(
            [data_sources[i] for i in mine],
            [solution_strs[i] for i in mine],
            [ground_truths[i] for i in mine],
            [extra_infos[i] for i in mine],
            **ours,
        )
        for i, score in zip(mine, graded):
            scores[i] = score
    others = [i for i in range(len(solution_strs)) if scores[i] is None]
    if others:
        # deferred: importing this module must not load verl; it loads once the prelude patched it
        from verl.utils.reward_score import default_compute_score

        for i in others:
            scores[i] = default_compute_score(
                data_sources[i], solution_strs[i], ground_truths[i], extra_infos[i], **theirs
            )
    return scores
