"""What one run of a weight tool wrote: the conversion, the export and the FP8 cast each resume a run cut short, so
a run reports its output units (shards or ranks) written now apart from those an earlier run had finished."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class WriteReport:
    unit: str  # what the tool writes one at a time: "shard" (an HF safetensors file) or "rank" (a Megatron rank)
    total: int = 0
    written: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # finished by an earlier run, left as they are
    out_bytes: int = 0

    def summary(self, dest: object, seconds: float, *details: str) -> str:
        """The line a tool prints when it is done: what it wrote and had already done, any `details`, the size."""
        done = ", ".join([f"{len(self.written)} {self.unit}(s) written, {len(self.skipped)} already done", *details])
        return f"{done}; {self.out_bytes / 1e9:.2f} GB in {dest} ({seconds:.1f} s)"
