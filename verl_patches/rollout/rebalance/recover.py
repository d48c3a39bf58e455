"""After generation: outputs of migrated requests go back to their source rank and are regrouped
under their parent request (the vendor's deepseek copy lacked this step and dropped them).

A migrated request runs on the receiver as `src_rank_{src}_{request_id}`. vLLM V1 fans a request with
n > 1 out into children `{index}_{parent_id}`; each child migrates on its own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

_MIGRATED = re.compile(r"^src_rank_(\d+)_(.+)$")
_CHILD = re.compile(r"^(\d+)_(.+)$")


def migrated_id(src: int, request_id: str) -> str:
    return f"src_rank_{src}_{request_id}"


def parse_migrated(request_id: str) -> tuple[int, str] | None:
    m = _MIGRATED.match(request_id)
    return (int(m.group(1)), m.group(2)) if m else None


@dataclass
class Completion:
    index: int
    token_ids: list[int]
    logprobs: Any = None


@dataclass
class Output:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[Completion] = field(default_factory=list)


def split_migrated(outputs: Iterable[Output]) -> tuple[list[Output], dict[int, list[Output]]]:
    """(outputs of this rank's own requests, {source rank: outputs to send back})."""
    own: list[Output] = []
    back: dict[int, list[Output]] = {}
    for o in outputs:
        parsed = parse_migrated(o.request_id)
        if parsed is None:
            own.append(o)
        else:
            src, rid = parsed
            back.setdefault(src, []).append(Output(rid, o.prompt_token_ids, o.outputs))
    return own, back


def regroup(own: Sequence[Output], returned: Iterable[Output], order: Sequence[str]) -> list[Output]:
    """Merge children into their parents and return one output per original request, in `order`."""
    parents: dict[str, Output] = {}
    for o in list(own) + list(returned):
        m = _CHILD.match(o.request_id)
        parent_id = m.group(2) if m and m.group(2) in order else o.request_id
        index = int(m.group(1)) if m and m.group(2) in order else None
        parent = parents.setdefault(parent_id, Output(parent_id, o.prompt_token_ids, []))
        for c in o.outputs:
            parent.outputs.append(Completion(index if index is not None else c.index, c.token_ids, c.logprobs))
    missing = [rid for rid in order if rid not in parents]
    if missing:
        raise RuntimeError(f"rebalance recovery lost request(s) {missing[:5]}")
    for p in parents.values():
        p.outputs.sort(key=lambda c: c.index)
        indices = [c.index for c in p.outputs]
        if len(set(indices)) != len(indices):
            raise RuntimeError(f"request {p.request_id}: sample index returned twice: {indices}")
    return [parents[rid] for rid in order]
