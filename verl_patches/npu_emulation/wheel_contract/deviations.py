"""The emulation's declared departures from the wheel, each with its reason. Data only (the audit reads it without
torch); `registration` applies them.

`MUTATIONS`: alias marks the wheel's schema text lacks.

npu_kv_rmsnorm_rope_cache (torch_npu's op and TorchAir's ``npu_inference`` copy) writes its caches in place and
returns them, and the wheel's text marks neither. Without the marks, functionalization (torch.compile through AOT
autograd: aot_eager, inductor) takes the op for a pure function of fresh outputs: it may drop or reorder the
cache write against the same step's attention reads of those caches, and the returned caches would not alias the
inputs they are. The wheel's Meta function returns ``empty_like(cache)`` for them; it is wrapped to return the
cache itself.

`META_DISAGREEMENTS`: outputs where the wheel's own Meta function is wrong about the real kernel, which the eager
check of every call therefore does not compare (the test shows the Meta function does disagree there).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutation:
    """Alias marks added to the wheel's schema: argument -> alias set, return index -> alias set; and why."""

    arguments: dict[str, str]
    returns: dict[int, str]
    reason: str


_CACHE_WRITES = Mutation(
    arguments={"k_cache": "a", "ckv_cache": "b"},
    returns={0: "a", 1: "b"},
    reason="writes k_cache and ckv_cache in place and returns them: without alias marks, functionalization "
    "(torch.compile through AOT autograd) may drop or reorder the write and treats the returned caches as fresh",
)

MUTATIONS: dict[str, Mutation] = {
    "npu::npu_kv_rmsnorm_rope_cache": _CACHE_WRITES,
    "npu_inference::npu_kv_rmsnorm_rope_cache": _CACHE_WRITES,
}


@dataclass(frozen=True)
class MetaDisagreement:
    """Outputs for which the wheel's Meta function is known to disagree with the real kernel, for the argument values
    named: the eager check (registration.check_against_meta) does not compare them there; the Meta function still
    sizes the rest, and tracing still uses it as it is."""

    outputs: tuple[int, ...]
    argument: str
    values: tuple[object, ...]
    reason: str


META_DISAGREEMENTS: dict[str, MetaDisagreement] = {
    "npu::npu_fusion_attention": MetaDisagreement(
        outputs=(1, 2),
        argument="input_layout",
        values=("BSND", "TND"),
        reason="the wheel's Meta function sizes softmax_max / softmax_sum [B, N, S1, 8] with S1 = query.size(2) for "
        "every layout but BSH and SBH: that is N for BSND and D for TND ([T, N, D, 8]), where the kernel returns "
        "[B, N, S, 8] and [T, N, 8] (MindSpeed's TND context-parallel code, flatten_softmax, reads them so); "
        "MindSpeed calls TND for packed sequences",
    ),
}
