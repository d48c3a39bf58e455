"""Per-engine comparison with the reference: max and mean absolute difference, the worst token, the verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EngineDiff:
    engine: str
    max_abs: float
    mean_abs: float
    worst_seq: int
    worst_pos: int  # position in the sequence (prompt tokens included) of the worst scored token
    worst_token: int
    reference: float
    got: float

    def line(self) -> str:
        return (
            f"{self.engine}: max |diff| {self.max_abs:.3e}, mean |diff| {self.mean_abs:.3e} "
            f"(worst: sequence {self.worst_seq}, token position {self.worst_pos}, token id {self.worst_token}: "
            f"reference {self.reference:.6f}, {self.engine} {self.got:.6f})"
        )


def compare(engine: str, reference: torch.Tensor, got: torch.Tensor, input_ids: torch.Tensor) -> EngineDiff:
    """``reference`` and ``got`` are [B, R] log-probs of the last R tokens of ``input_ids`` [B, S]; a non-finite
    value counts as an infinite difference."""
    if reference.shape != got.shape:
        raise ValueError(f"{engine}: log-probs of shape {tuple(got.shape)}, the reference has {tuple(reference.shape)}")
    ref, val = reference.double(), got.double()
    diff = (ref - val).abs()
    diff = torch.where(torch.isfinite(ref) & torch.isfinite(val), diff, torch.full_like(diff, math.inf))
    flat = int(diff.reshape(-1).argmax())
    b, j = divmod(flat, diff.shape[1])
    pos = input_ids.shape[1] - diff.shape[1] + j
    return EngineDiff(
        engine,
        float(diff.max()),
        float(diff.mean()),
        b,
        pos,
        int(input_ids[b, pos]),
        float(ref[b, j]),
        float(val[b, j]),
    )


def verdict(diffs: list[EngineDiff], tolerance: float) -> tuple[bool, list[str]]:
    """All within ``tolerance`` (max |diff|)? Report lines, the failing engines named with their worst token."""
    lines = [d.line() for d in diffs]
    bad = [d for d in diffs if not d.max_abs <= tolerance]
    for d in bad:
        lines.append(
            f"FAIL {d.engine}: max |diff| {d.max_abs:.3e} > tolerance {tolerance:g} at sequence "
            f"{d.worst_seq}, token position {d.worst_pos}"
        )
    if not bad:
        lines.append(f"PASS: every engine within {tolerance:g} of Hugging Face")
    return not bad, lines
