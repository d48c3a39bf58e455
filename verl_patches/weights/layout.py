"""Parallel layout of a legacy Megatron checkpoint for MindSpeed-LLM DeepSeek-V3 (pure planning).

A checkpoint rank is ``(tp, pp, ep)``; its folder is ``mp_rank_TT`` + ``_PPP`` when PP > 1 + ``_EEE`` when
EP > 1 (Megatron's ``get_checkpoint_name``). Pipeline stage ``pp`` holds consecutive decoder layers
(``num_layer_list`` for an uneven split, else ``num_layers / PP`` each), numbered from 0 inside the stage;
stage 0 also holds the embedding, the last stage the final norm and the output layer.

Routed experts: without TP-extend-EP, EP rank ``ep`` holds experts ``[ep*E/EP, (ep+1)*E/EP)`` and every TP
rank holds a 1/TP slice of each expert's FFN dimension. With ``moe_tp_extend_ep`` the experts are split
over EP x TP buckets instead (bucket ``ep*TP + tp`` holds ``E/(EP*TP)`` whole experts; expert TP = 1).
Everything that is not a routed expert is replicated over EP.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from verl_patches.base.strict_int import IntError, parse_int
from verl_patches.weights.errors import LayoutError


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    pp: int = 1
    ep: int = 1
    num_layer_list: tuple[int, ...] | None = None
    moe_grouped_gemm: bool = False
    moe_tp_extend_ep: bool = False

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_layer_list"] = list(self.num_layer_list) if self.num_layer_list else None
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ParallelLayout:
        nll = d.get("num_layer_list")
        return cls(
            tp=int(d["tp"]),
            pp=int(d["pp"]),
            ep=int(d["ep"]),
            num_layer_list=tuple(int(x) for x in nll) if nll else None,
            moe_grouped_gemm=bool(d["moe_grouped_gemm"]),
            moe_tp_extend_ep=bool(d["moe_tp_extend_ep"]),
        )


@dataclass(frozen=True)
class Rank:
    tp: int
    pp: int
    ep: int


def parse_layer_list(text: str | None) -> tuple[int, ...] | None:
    """``"7,7,8"`` -> ``(7, 7, 8)``; errors name the flag and the bad item."""
    if text is None or text == "":
        return None
    items = [s.strip() for s in text.split(",")]
    try:
        return tuple(parse_int(s, "item") for s in items)
    except IntError:
        raise LayoutError(f"--num-layer-list {text[:80]!r}: items must be integers separated by commas") from None


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise LayoutError(msg)


def validate_layout(
    layout: ParallelLayout,
    cfg: Mapping[str, Any],
    num_layers: int | None = None,
    first_k_dense_replace: int | None = None,
) -> None:
    """Check the flags against each other and the model config before any work; errors name the flag."""
    for flag, v in (
        ("--target-tensor-parallel-size", layout.tp),
        ("--target-pipeline-parallel-size", layout.pp),
        ("--target-expert-parallel-size", layout.ep),
    ):
        _need(isinstance(v, int) and v >= 1, f"{flag} must be a positive integer, got {v!r}")
    n = cfg["num_hidden_layers"]
    if num_layers is not None:
        _need(num_layers == n, f"--num-layers {num_layers} differs from num_hidden_layers={n} in config.json")
    fk = cfg["first_k_dense_replace"]
    if first_k_dense_replace is not None:
        _need(
            first_k_dense_replace == fk,
            f"--first-k-dense-replace {first_k_dense_replace} differs from first_k_dense_replace={fk} in config.json",
        )
    if layout.num_layer_list is not None:
        lst = layout.num_layer_list
        _need(
            len(lst) == layout.pp,
            f"--num-layer-list has {len(lst)} entries but --target-pipeline-parallel-size is {layout.pp}",
        )
        _need(
            all(x >= 1 for x in lst),
            f"--num-layer-list {','.join(map(str, lst))}: every stage needs at least one layer",
        )
        _need(sum(lst) == n, f"--num-layer-list {','.join(map(str, lst))} sums to {sum(lst)}, not num_layers={n}")
    else:
        _need(
            n % layout.pp == 0,
            f"num_layers={n} is not divisible by --target-pipeline-parallel-size {layout.pp}; give --num-layer-list",
        )
    tp = layout.tp
    for key in ("num_attention_heads", "vocab_size", "intermediate_size"):
        _need(
            cfg[key] % tp == 0,
            f"{key}={cfg[key]} in config.json is not divisible by --target-tensor-parallel-size {tp}",
        )
    shared = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    _need(
        shared % tp == 0,
        f"moe_intermediate_size*n_shared_experts={shared} is not divisible by --target-tensor-parallel-size {tp}",
    )
    e = cfg["n_routed_experts"]
    if layout.moe_tp_extend_ep:
        _need(
            layout.moe_grouped_gemm,
            "--moe-tp-extend-ep needs --moe-grouped-gemm (MindSpeed-LLM's per-expert layout does not support it)",
        )
        _need(
            e % (layout.ep * tp) == 0,
            f"n_routed_experts={e} is not divisible by EP*TP={layout.ep * tp} "
            f"(--moe-tp-extend-ep splits experts over EP x TP)",
        )
    else:
        _need(e % layout.ep == 0, f"n_routed_experts={e} is not divisible by --target-expert-parallel-size {layout.ep}")
        _need(
            cfg["moe_intermediate_size"] % tp == 0,
            f"moe_intermediate_size={cfg['moe_intermediate_size']} is not divisible by "
            f"--target-tensor-parallel-size {tp} (experts are TP-sliced without --moe-tp-extend-ep)",
        )
    _need(isinstance(cfg.get("q_lora_rank"), int), "config.json: key 'q_lora_rank' must be set (MLA with a q LoRA)")


def stage_layer_counts(layout: ParallelLayout, num_layers: int) -> tuple[int, ...]:
    if layout.num_layer_list is not None:
        return layout.num_layer_list
    return (num_layers // layout.pp,) * layout.pp


def stage_layers(layout: ParallelLayout, num_layers: int) -> list[list[int]]:
    """Global (HF) layer indices of each pipeline stage."""
    out, start = [], 0
    for c in stage_layer_counts(layout, num_layers):
        out.append(list(range(start, start + c)))
        start += c
    return out


def rank_dir_name(layout: ParallelLayout, rank: Rank) -> str:
    name = f"mp_rank_{rank.tp:02d}"
    if layout.pp > 1:
        name += f"_{rank.pp:03d}"
    if layout.ep > 1:
        name += f"_{rank.ep:03d}"
    return name


def all_ranks(layout: ParallelLayout) -> Iterator[Rank]:
    """Stage-major order: consecutive ranks read the same source layers (warm page cache)."""
    for pp in range(layout.pp):
        for ep in range(layout.ep):
            for tp in range(layout.tp):
                yield Rank(tp, pp, ep)


def expert_tp(layout: ParallelLayout) -> int:
    """How many slices each routed expert's FFN dimension is cut into."""
    return 1 if layout.moe_tp_extend_ep else layout.tp


def local_experts(layout: ParallelLayout, num_experts: int, rank: Rank) -> range:
    """Global indices of the routed experts held by ``rank``."""
    if layout.moe_tp_extend_ep:
        n = num_experts // (layout.ep * layout.tp)
        b = rank.ep * layout.tp + rank.tp
    else:
        n = num_experts // layout.ep
        b = rank.ep
    return range(b * n, (b + 1) * n)


def expert_slice_index(layout: ParallelLayout, rank: Rank) -> int:
    """Which FFN slice of its experts ``rank`` holds (always 0 with TP-extend-EP)."""
    return 0 if layout.moe_tp_extend_ep else rank.tp


def owners_of_expert(layout: ParallelLayout, num_experts: int, expert: int, pp: int) -> list[Rank]:
    """The ranks holding expert ``expert``, ordered by FFN slice."""
    if layout.moe_tp_extend_ep:
        n = num_experts // (layout.ep * layout.tp)
        b = expert // n
        return [Rank(b % layout.tp, pp, b // layout.tp)]
    n = num_experts // layout.ep
    return [Rank(t, pp, expert // n) for t in range(layout.tp)]
