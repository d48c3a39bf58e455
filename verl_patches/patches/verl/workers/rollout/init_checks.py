"""F1: verl's ``vLLMRollout.__init__`` without the two checks the A3 rollout settings trip, every other
statement upstream's own.

verl v0.4.0 refuses, in ``__init__``:
  1. ``enforce_eager=False`` together with ``free_cache_engine=True`` (an ``assert``): a captured CUDA graph
     keeps the KV cache's addresses, so freeing the cache would break it;
  2. chunked prefill with ``max_num_batched_tokens < max_model_len`` (``raise ValueError``).
The A3 job runs exactly both (the vendor removed both checks): TorchAir graph mode takes the KV cache as
an input every step and our lifecycle rebuilds it with the first init's block count (F3), and vLLM V1
and vllm-ascend's scheduler run chunked prefill below ``max_model_len``. What those checks protected is
checked before the job starts instead (``verl_patches.driver.rollout_settings``: the trainer entry and
the preflight refuse a contradiction).

How: the replacement is compiled from upstream's own source of ``__init__`` (the file at the pinned
fingerprint) with exactly those two top-level statements left out, each found by what it tests; if
either is not found exactly once, nothing is patched and the error says which. Everything else (the
tensor-parallel size check, the max_position_embeddings check, engine construction, sampling parameters)
is upstream's code, run in upstream's module (so ``LLM`` is whatever that module's name is bound to: our
engine factory on NPU, the CPU stand-in on CPU) and reported at upstream's line numbers.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verl_patches.patching.source_edit import SourceEditError, recompile


class CheckNotFoundError(SourceEditError):
    """Upstream's __init__ does not contain the statement a drop names (exactly once)."""


@dataclass(frozen=True)
class DroppedCheck:
    name: str  # what the check refused, for messages and the audit
    statement: type[ast.stmt]  # ast.Assert or ast.If
    names: frozenset[str]  # attribute/variable names its test reads (all of them)
    raises: str = ""  # for an If: the exception its body raises


DROPPED = (
    DroppedCheck(
        "enforce_eager=False with free_cache_engine=True", ast.Assert, frozenset({"enforce_eager", "free_cache_engine"})
    ),
    DroppedCheck(
        "chunked prefill with max_num_batched_tokens < max_model_len",
        ast.If,
        frozenset({"max_num_batched_tokens", "max_model_len", "enable_chunked_prefill"}),
        "ValueError",
    ),
)


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _matches(stmt: ast.stmt, drop: DroppedCheck) -> bool:
    if not isinstance(stmt, drop.statement) or not drop.names <= _names(stmt.test):  # type: ignore[attr-defined]
        return False
    if drop.statement is ast.If:
        body = stmt.body  # type: ignore[attr-defined]
        return (
            len(body) == 1
            and isinstance(body[0], ast.Raise)
            and not stmt.orelse  # type: ignore[attr-defined]
            and drop.raises in _names(body[0].exc)
        )
    return True


def without_checks(original: Callable[..., Any], drops: tuple[DroppedCheck, ...] = DROPPED) -> Callable[..., Any]:
    """`original` compiled again from its source without the top-level statements `drops` name."""

    def drop_checks(fn: ast.FunctionDef) -> None:
        kept = list(fn.body)
        for drop in drops:
            hits = [s for s in kept if _matches(s, drop)]
            if len(hits) != 1:
                raise CheckNotFoundError(
                    f"{original.__module__}.{original.__qualname__}: found {len(hits)} statements "
                    f"checking {drop.name} (expected exactly 1); the patch was written for verl v0.4.0"
                )
            kept.remove(hits[0])
        fn.body = kept

    try:
        new = recompile(original, drop_checks)
    except SourceEditError as e:
        raise CheckNotFoundError(str(e)) from None
    new.dropped_checks = tuple(d.name for d in drops)  # for tests and the audit
    return new
