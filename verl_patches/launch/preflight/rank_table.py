"""The per-rank layout a job will use, for `--dry-run` (pure; rank arithmetic from reshard.layout).

Training: every global rank's TP/CP/EP/DP/PP coordinates (Megatron order ``tp-cp-ep-dp-pp``) and the
decoder layers its pipeline stage builds from the (uneven) layer list. Rollout: every global rank's
vLLM TP rank, DP rank (engine index inside its instance), instance, expert-parallel rank and the
routed experts it serves.

`render_rank_tables` prints them compactly: one block per pipeline stage / vLLM instance, each group of
ranks as a range, and long lists elided in the middle when the elided entries follow the printed rule
(checked on the rows, so the print never claims a pattern the table does not have).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from verl_patches.base.job_layout import JobLayoutError, cluster_of, rollout_of, training_of
from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.layout import MegatronLayout, RolloutLayout


@dataclass(frozen=True)
class TrainingRank:
    rank: int
    tp: int
    cp: int
    ep: int
    dp: int
    pp: int
    layers: range  # global decoder-layer indices built on this rank's stage

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["layers"] = [self.layers.start, self.layers.stop]
        return d


@dataclass(frozen=True)
class RolloutRank:
    rank: int
    tp: int
    dp: int  # engine index inside the instance (vLLM's DP rank)
    instance: int
    ep: int
    experts: range

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["experts"] = [self.experts.start, self.experts.stop]
        return d


def stage_layers(num_layers: int, pp: int, layer_list: Sequence[int] | None = None) -> list[range]:
    """Layers of each pipeline stage: the layer list's prefix sums, or an even split."""
    if layer_list is None:
        if num_layers % pp:
            raise InvalidLayoutError("layers_divisible_by_pp", f"{num_layers} layers do not split evenly over PP{pp}")
        counts = [num_layers // pp] * pp
    else:
        counts = [int(n) for n in layer_list]
        if len(counts) != pp or sum(counts) != num_layers or any(n < 1 for n in counts):
            raise InvalidLayoutError("layer_list", f"layer list {counts} does not give {num_layers} layers over PP{pp}")
    out, start = [], 0
    for n in counts:
        out.append(range(start, start + n))
        start += n
    return out


def training_rank_table(
    layout: MegatronLayout, num_layers: int, layer_list: Sequence[int] | None = None
) -> list[TrainingRank]:
    stages = stage_layers(num_layers, layout.pp, layer_list)
    return [
        TrainingRank(rank=c.rank, tp=c.tp, cp=c.cp, ep=c.ep, dp=c.dp, pp=c.pp, layers=stages[c.pp])
        for c in (layout.coords(r) for r in range(layout.world_size))
    ]


def rollout_rank_table(layout: RolloutLayout, num_experts: int) -> list[RolloutRank]:
    out = []
    for g in range(layout.world_size):
        e = layout.ep_rank(g)
        out.append(
            RolloutRank(
                rank=g,
                tp=e % layout.tp,
                dp=e // layout.tp,
                instance=layout.instance_of(g),
                ep=e,
                experts=layout.owned_experts(g, num_experts),
            )
        )
    return out


# ---- compact text --------------------------------------------------------------------------------


def _span(values: Sequence[int]) -> str:
    """'4' / '4-7' for a consecutive run / '0,2,5' otherwise."""
    if not values:
        return "-"
    if len(values) == 1:
        return str(values[0])
    if list(values) == list(range(values[0], values[0] + len(values))):
        return f"{values[0]}-{values[-1]}"
    return ",".join(str(v) for v in values)


def _rng(r: range) -> str:
    return "none" if len(r) == 0 else (str(r.start) if len(r) == 1 else f"{r.start}-{r.stop - 1}")


def _is_affine(items: list[tuple[int, ...]]) -> bool:
    """Every coordinate of the items changes by a constant step from one item to the next."""
    if len(items) < 3:
        return True
    steps = [b - a for a, b in zip(items[0], items[1])]
    return all([b - a for a, b in zip(x, y)] == steps for x, y in zip(items, items[1:]))


def _pack(entries: list[str], keys: list[tuple[int, ...]], width: int, indent: str, max_entries: int) -> list[str]:
    """Wrap entries into lines; elide the middle of a long list whose keys follow an affine rule."""
    if len(entries) > max_entries and _is_affine(keys):
        head = max_entries // 2
        entries = entries[:head] + [f"... ({len(entries) - head - 1} more, same step) ..."] + entries[-1:]
    lines, cur = [], indent
    for e in entries:
        piece = e if cur == indent else " · " + e
        if len(cur) + len(piece) > width and cur != indent:
            lines.append(cur)
            cur = indent + e
        else:
            cur += piece
    lines.append(cur)
    return lines


def render_training(
    table: list[TrainingRank], layout: MegatronLayout, width: int = 120, max_entries: int = 8
) -> list[str]:
    lines = [
        f"training ranks: TP{layout.tp} CP{layout.cp} EP{layout.ep} DP{layout.dp} PP{layout.pp} over "
        f"{layout.world_size}, order {layout.order}; each group lists its ranks in TP order"
    ]
    for stage in range(layout.pp):
        rows = [r for r in table if r.pp == stage]
        lines.append(
            f"  pp{stage} layers {_rng(rows[0].layers)} ({len(rows[0].layers)}): ranks "
            f"{_span(sorted(r.rank for r in rows))}"
        )
        groups: dict[tuple[int, int, int], list[TrainingRank]] = {}
        for r in rows:
            groups.setdefault((r.dp, r.ep, r.cp), []).append(r)
        entries, keys = [], []
        for (dp, ep, cp), members in sorted(groups.items()):
            ranks = [m.rank for m in sorted(members, key=lambda m: m.tp)]
            cp_txt = f" cp{cp}" if layout.cp > 1 else ""
            entries.append(f"dp{dp} ep{ep}{cp_txt}: {_span(ranks)}")
            keys.append((dp, ep, cp, ranks[0], ranks[-1]))
        lines += _pack(entries, keys, width, "    ", max_entries)
    return lines


def render_rollout(
    table: list[RolloutRank], layout: RolloutLayout, num_experts: int, width: int = 120, max_entries: int = 8
) -> list[str]:
    lines = [
        f"rollout ranks: TP{layout.tp} x DP{layout.dp_per_instance} per instance, "
        f"{layout.num_instances} instance(s), EP{layout.ep_size} over {num_experts} routed experts"
    ]
    for inst in range(layout.num_instances):
        rows = [r for r in table if r.instance == inst]
        lines.append(f"  instance {inst}: ranks {_span([r.rank for r in rows])}; engine (dp rank): ranks by tp rank")
        engines: dict[int, list[RolloutRank]] = {}
        for r in rows:
            engines.setdefault(r.dp, []).append(r)
        entries, keys = [], []
        for dp, members in sorted(engines.items()):
            ranks = [m.rank for m in sorted(members, key=lambda m: m.tp)]
            entries.append(f"dp{dp}: {_span(ranks)}")
            keys.append((dp, ranks[0], ranks[-1]))
        lines += _pack(entries, keys, width, "    ", max_entries)
        entries, keys = [], []
        for r in rows:
            entries.append(f"r{r.rank}(ep{r.ep}): {_rng(r.experts)}")
            keys.append((r.rank, r.ep, r.experts.start, r.experts.stop))
        lines.append("    experts by rank:")
        lines += _pack(entries, keys, width, "      ", max_entries)
    return lines


def render_rank_tables(
    training: tuple[list[TrainingRank], MegatronLayout] | None,
    rollout: tuple[list[RolloutRank], RolloutLayout, int] | None,
) -> str:
    lines: list[str] = []
    if training is not None:
        lines += render_training(*training)
    if rollout is not None:
        lines += render_rollout(*rollout)
    return "\n".join(lines)


# ---- from a composed config -----------------------------------------------------------------------


def rank_tables_for_config(cfg: Any, model: dict[str, Any]) -> dict[str, Any]:
    """{'training': (rows, layout) or None, 'rollout': (rows, layout, experts) or None, 'problems': [...]}."""
    # lazy: that module loads omegaconf; importing this one must not
    from verl_patches.launch.preflight.findings import get
    from verl_patches.launch.preflight.layout import LAYER_LIST

    out: dict[str, Any] = {"training": None, "rollout": None, "problems": []}
    try:
        world = cluster_of(cfg).world
    except JobLayoutError as e:
        out["problems"].append(f"cluster: {e}")
        return out
    if get(cfg, "actor_rollout_ref.actor.strategy") == "megatron":
        try:
            t = training_of(cfg, world)
            layout = MegatronLayout(world_size=world, tp=t.tp, pp=t.pp, ep=t.ep, cp=t.cp)
            lst = get(cfg, LAYER_LIST)
            rows = training_rank_table(
                layout, int(model["num_hidden_layers"]), None if lst is None else [int(x) for x in lst]
            )
            out["training"] = (rows, layout)
        except (InvalidLayoutError, KeyError, TypeError, ValueError) as e:
            out["problems"].append(f"training layout: {e}")
    try:
        r = rollout_of(cfg, world)
        experts = int(model["n_routed_experts"])
        layout_r = RolloutLayout(world_size=world, tp=r.tp, dp_per_instance=r.dp_per_instance)
        out["rollout"] = (rollout_rank_table(layout_r, experts), layout_r, experts)
    except (InvalidLayoutError, KeyError, TypeError, ValueError) as e:
        out["problems"].append(f"rollout layout: {e}")
    return out


def rank_layout_text(tables: dict[str, Any]) -> str:
    text = render_rank_tables(tables["training"], tables["rollout"])
    problems = "\n".join(f"  not shown: {p}" for p in tables["problems"])
    return "per-rank layout\n" + "\n".join(x for x in (text, problems) if x)


def rank_layout_json(tables: dict[str, Any]) -> dict[str, Any]:
    return {
        "training": None if tables["training"] is None else [r.as_dict() for r in tables["training"][0]],
        "rollout": None if tables["rollout"] is None else [r.as_dict() for r in tables["rollout"][0]],
        "problems": list(tables["problems"]),
    }
