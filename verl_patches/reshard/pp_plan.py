"""Pipeline all-gather planner (vendor item E3): which parameters every stage can exchange in lockstep.

After a TP gather inside each stage, every rank must see every stage's parameters. Instead of one
broadcast per parameter from its owning stage (repeated TP gathers on every stage), the stages exchange
parameters *in lockstep*: call ``i`` carries the ``i``-th eligible parameter of every stage at once.
That needs every stage to enumerate the same number of eligible parameters, in the same order, with the
same shapes and dtypes, although stages own different numbers of layers (``[7,7,8,8,8,8,8,7]``) and
stage 0's first layers are dense.

Eligibility is structural here rather than a list of name patterns: a parameter
``decoder.layers.<i>.<suffix>`` (``i`` local to the stage) is eligible when *every* stage has
``decoder.layers.<i>.<suffix>`` with the same shape and dtype, and the name contains no excluded
substring (routed experts, which take the expert reshard). That yields the vendor's rules as
consequences - local index below ``min(num_layer_list)``; a dense layer's MLP, and the MoE MLP at the same
local index on other stages, never line up - and cannot produce misaligned stages by construction.
Non-layer parameters (embedding, final norm, output layer) exist on one stage only and are ineligible.

Eligible parameters are grouped into buckets (consecutive, same dtype, at most ``bucket_bytes`` each
unless a single parameter is larger) so one collective carries many parameters; ``bucket_bytes=None``
gives one parameter per call, the vendor's granularity.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from math import prod

from verl_patches.reshard.errors import InvalidLayoutError

LAYER_NAME = re.compile(r"^(?P<head>(?:.*\.)?decoder\.layers\.)(?P<index>\d+)\.(?P<suffix>.+)$")
DEFAULT_EXCLUDED = (".mlp.experts.",)
DTYPE_BYTES = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
}


def dtype_bytes(dtype: str) -> int:
    key = str(dtype).removeprefix("torch.")
    if key not in DTYPE_BYTES:
        raise InvalidLayoutError("known_dtype", f"unknown dtype {dtype!r} (known: {sorted(DTYPE_BYTES)})")
    return DTYPE_BYTES[key]


@dataclass(frozen=True)
class ParamSpec:
    """A parameter as one stage holds it for the exchange (after its TP gather)."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "bfloat16"

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * dtype_bytes(self.dtype)


def validate_layer_list(num_layer_list: Sequence[int], pp: int, num_layers: int | None = None) -> None:
    if len(num_layer_list) != pp:
        raise InvalidLayoutError(
            "layer_list_length_is_pp",
            f"num_layer_list {list(num_layer_list)} has {len(num_layer_list)} entries for {pp} pipeline stages",
        )
    if any(n < 1 for n in num_layer_list):
        raise InvalidLayoutError(
            "layer_list_positive", f"num_layer_list {list(num_layer_list)} has a stage without layers"
        )
    if num_layers is not None and sum(num_layer_list) != num_layers:
        raise InvalidLayoutError(
            "layer_list_sums_to_num_layers",
            f"num_layer_list {list(num_layer_list)} sums to {sum(num_layer_list)}, not num_layers {num_layers}",
        )


def layer_offsets(num_layer_list: Sequence[int]) -> tuple[int, ...]:
    """Global index of each stage's first layer: [7,7,8,...] → (0, 7, 14, 22, ...)."""
    return (0,) + tuple(accumulate(num_layer_list))[:-1]


def stage_of_layer(num_layer_list: Sequence[int], layer: int) -> int:
    for stage, (start, n) in enumerate(zip(layer_offsets(num_layer_list), num_layer_list)):
        if start <= layer < start + n:
            return stage
    raise InvalidLayoutError("layer_in_range", f"layer {layer} not in [0, {sum(num_layer_list)})")


def split_layer_name(name: str) -> tuple[int, str] | None:
    m = LAYER_NAME.match(name)
    return (int(m["index"]), m["suffix"]) if m else None


def global_name(name: str, offset: int) -> str:
    """``decoder.layers.<local>.x`` → ``decoder.layers.<local+offset>.x``; other names unchanged."""
    m = LAYER_NAME.match(name)
    if not m:
        return name
    return f"{m['head']}{int(m['index']) + offset}.{m['suffix']}"


@dataclass(frozen=True)
class PpGatherPlan:
    num_layer_list: tuple[int, ...]
    eligible: tuple[tuple[str, ...], ...]  # per stage, local names, aligned index by index
    shapes: tuple[tuple[int, ...], ...]  # per eligible index (equal on every stage)
    dtypes: tuple[str, ...]
    ineligible: tuple[tuple[str, ...], ...]  # per stage, in the stage's own order
    buckets: tuple[tuple[int, int], ...]  # [start, stop) ranges of eligible indices

    @property
    def pp(self) -> int:
        return len(self.num_layer_list)

    @property
    def offsets(self) -> tuple[int, ...]:
        return layer_offsets(self.num_layer_list)

    def global_names(self, stage: int) -> tuple[str, ...]:
        off = self.offsets[stage]
        return tuple(global_name(n, off) for n in self.eligible[stage])

    def numel(self, index: int) -> int:
        return prod(self.shapes[index])

    def bucket_numel(self, bucket: int) -> int:
        start, stop = self.buckets[bucket]
        return sum(self.numel(i) for i in range(start, stop))

    def bucket_bytes(self, bucket: int) -> int:
        start, _ = self.buckets[bucket]
        return self.bucket_numel(bucket) * dtype_bytes(self.dtypes[start])

    @property
    def stage_eligible_bytes(self) -> int:
        return sum(self.bucket_bytes(b) for b in range(len(self.buckets)))


def plan_pp_gather(
    stage_params: Sequence[Sequence[ParamSpec]],
    num_layer_list: Sequence[int],
    bucket_bytes: int | None = 256 * 2**20,
    exclude: Sequence[str] = DEFAULT_EXCLUDED,
) -> PpGatherPlan:
    """Select the parameters all stages can exchange in lockstep, and bucket them."""
    validate_layer_list(num_layer_list, len(stage_params))
    keyed: list[dict[tuple[int, str], ParamSpec]] = []
    for stage, params in enumerate(stage_params):
        table: dict[tuple[int, str], ParamSpec] = {}
        for p in params:
            key = split_layer_name(p.name)
            if key is None:
                continue
            if key[0] >= num_layer_list[stage]:
                raise InvalidLayoutError(
                    "local_layer_index_in_stage",
                    f"stage {stage} lists {p.name} but owns only {num_layer_list[stage]} layers",
                )
            table[key] = p
        keyed.append(table)

    def aligned(key: tuple[int, str]) -> bool:
        first = keyed[0][key]
        if any(x in first.name for x in exclude):
            return False
        return all(key in t and t[key].shape == first.shape and t[key].dtype == first.dtype for t in keyed[1:])

    order = [k for k in (split_layer_name(p.name) for p in stage_params[0]) if k and aligned(k)]
    eligible = tuple(tuple(t[k].name for k in order) for t in keyed)
    chosen = [set(names) for names in eligible]
    ineligible = tuple(
        tuple(p.name for p in params if p.name not in chosen[s]) for s, params in enumerate(stage_params)
    )
    shapes = tuple(tuple(keyed[0][k].shape) for k in order)
    dtypes = tuple(keyed[0][k].dtype for k in order)

    buckets: list[tuple[int, int]] = []
    start, size = 0, 0
    for i, k in enumerate(order):
        nbytes = keyed[0][k].nbytes
        full = bucket_bytes is None or size + nbytes > bucket_bytes or dtypes[i] != dtypes[start]
        if i > start and full:
            buckets.append((start, i))
            start, size = i, 0
        size += nbytes
    if order:
        buckets.append((start, len(order)))
    return PpGatherPlan(tuple(num_layer_list), eligible, shapes, dtypes, ineligible, tuple(buckets))
