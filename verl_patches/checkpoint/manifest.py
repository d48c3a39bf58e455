"""Pure: the training layout a checkpoint was written at, per-rank records, and the step manifest.

Every rank writes a record of what it saved (``ranks/rank_RRRRR.json``); the driver turns the records
into the step manifest only when they describe one complete, consistent save (all ranks of one layout,
every file present with its recorded size). Resuming compares the saved layout with the running one:
a change of the data-parallel size alone is supported (model shards are per model-parallel rank and the
distributed optimizer's state is saved gathered over DP); any other change is an error naming both
layouts and the supported conversion.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Mapping

MANIFEST_FILE = "checkpoint.json"
MANIFEST_VERSION = 1
RANKS_DIR = "ranks"


class CheckpointIncomplete(Exception):
    """A save did not produce every file it should have; the message names the rank and file."""


class LayoutChangeError(Exception):
    """The running layout cannot load this checkpoint; the message names both layouts and the way out."""


@dataclass(frozen=True)
class TrainLayout:
    """The Megatron training layout (what decides which tensor lives in which file)."""

    tp: int
    pp: int
    ep: int
    dp: int
    cp: int = 1
    num_layer_list: tuple[int, ...] | None = None
    moe_tp_extend_ep: bool = False
    use_distributed_optimizer: bool = True

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def describe(self) -> str:
        s = f"TP{self.tp}xPP{self.pp}xEP{self.ep}"
        if self.cp > 1:
            s += f"xCP{self.cp}"
        s += f" (DP{self.dp}, {self.world_size} ranks"
        if self.num_layer_list:
            s += f", layers {list(self.num_layer_list)}"
        if self.moe_tp_extend_ep:
            s += ", TP-extend-EP"
        return s + ")"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_layer_list"] = list(self.num_layer_list) if self.num_layer_list else None
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "TrainLayout":
        nll = d.get("num_layer_list")
        return cls(tp=int(d["tp"]), pp=int(d["pp"]), ep=int(d["ep"]), dp=int(d["dp"]), cp=int(d.get("cp", 1)),
                   num_layer_list=tuple(int(x) for x in nll) if nll else None,
                   moe_tp_extend_ep=bool(d.get("moe_tp_extend_ep", False)),
                   use_distributed_optimizer=bool(d.get("use_distributed_optimizer", True)))


@dataclass(frozen=True)
class RankRecord:
    """What one rank wrote: its place in the layout and its files (path relative to the role folder -> bytes)."""

    rank: int
    layout: TrainLayout
    tp_rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    files: Mapping[str, int] = field(default_factory=dict)

    @property
    def model_parallel_coords(self) -> tuple[int, int, int]:
        return (self.tp_rank, self.pp_rank, self.ep_rank)

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "layout": self.layout.to_json(), "tp_rank": self.tp_rank, "pp_rank": self.pp_rank,
                "ep_rank": self.ep_rank, "dp_rank": self.dp_rank, "files": dict(sorted(self.files.items()))}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RankRecord":
        return cls(rank=int(d["rank"]), layout=TrainLayout.from_json(d["layout"]), tp_rank=int(d["tp_rank"]),
                   pp_rank=int(d["pp_rank"]), ep_rank=int(d["ep_rank"]), dp_rank=int(d["dp_rank"]),
                   files={str(k): int(v) for k, v in d["files"].items()})


def rank_record_name(rank: int) -> str:
    return f"{RANKS_DIR}/rank_{rank:05d}.json"


def check_rank_records(role: str, records: Iterable[RankRecord], sizes: Mapping[str, int | None]) -> TrainLayout:
    """The layout all records agree on, after checking the save is complete.

    ``sizes`` maps every file a record names (relative to the role folder) to its size on disk, or None
    when missing. Raises CheckpointIncomplete naming the first rank and file at fault.
    """
    records = sorted(records, key=lambda r: r.rank)
    if not records:
        raise CheckpointIncomplete(f"{role}: no rank wrote a record ({RANKS_DIR}/rank_*.json)")
    layout = records[0].layout
    for r in records:
        if r.layout != layout:
            raise CheckpointIncomplete(f"{role}: rank {r.rank} saved at {r.layout.describe()}, rank "
                                       f"{records[0].rank} at {layout.describe()}")
    seen = [r.rank for r in records]
    missing = sorted(set(range(layout.world_size)) - set(seen))
    if missing or len(seen) != len(set(seen)) or seen[-1] >= layout.world_size:
        raise CheckpointIncomplete(f"{role}: rank records {seen} do not cover ranks 0..{layout.world_size - 1} of "
                                   f"{layout.describe()} (missing {missing[:8]})")
    for r in records:
        for name, size in sorted(r.files.items()):
            have = sizes.get(name)
            if have is None:
                raise CheckpointIncomplete(f"{role}: rank {r.rank}: {name} is missing")
            if have != size:
                raise CheckpointIncomplete(f"{role}: rank {r.rank}: {name} has {have} bytes, the rank wrote {size}")
    return layout


def manifest_json(step: int, roles: Mapping[str, TrainLayout | None], files: Mapping[str, int],
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The step manifest: step, each role's layout (None for a role whose workers keep no rank records), files."""
    return {"version": MANIFEST_VERSION, "step": step,
            "roles": {k: (v.to_json() if v is not None else None) for k, v in sorted(roles.items())},
            "files": dict(sorted(files.items())), **(dict(extra) if extra else {})}


def parse_manifest(text: str, where: str) -> dict[str, Any]:
    """The step manifest from its text; CheckpointIncomplete naming ``where`` and the key at fault."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise CheckpointIncomplete(f"{where}: line {err.lineno}: not valid JSON ({err.msg})") from None
    if not isinstance(data, dict):
        raise CheckpointIncomplete(f"{where}: expected a JSON object")
    for key, typ in (("version", int), ("step", int), ("roles", dict), ("files", dict)):
        if not isinstance(data.get(key), typ):
            raise CheckpointIncomplete(f"{where}: key {key!r} missing or not a {typ.__name__}")
    if data["version"] != MANIFEST_VERSION:
        raise CheckpointIncomplete(f"{where}: manifest version {data['version']}, this code reads {MANIFEST_VERSION}")
    return data


# the layout fields that decide which tensor lives in which file; DP (and the distributed optimizer's
# DP-gathered state) may change between save and resume
_SHARDING_FIELDS = ("tp", "pp", "ep", "cp", "num_layer_list", "moe_tp_extend_ep", "use_distributed_optimizer")


def layout_differences(saved: TrainLayout, running: TrainLayout) -> list[str]:
    diffs = []
    for k in _SHARDING_FIELDS:
        a, b = getattr(saved, k), getattr(running, k)
        if k == "num_layer_list" and saved.pp == running.pp == 1:
            continue
        if a != b:
            diffs.append(f"{k} {a!r} -> {b!r}")
    return diffs


def check_resume_layout(saved: TrainLayout, running: TrainLayout, where: str) -> str:
    """'' when the layouts are identical, a note when only DP changed; LayoutChangeError otherwise."""
    diffs = layout_differences(saved, running)
    if diffs:
        raise LayoutChangeError(
            f"{where} was saved at {saved.describe()} and cannot be resumed at {running.describe()} "
            f"({'; '.join(diffs)}): model shards and optimizer state are cut per model-parallel rank. "
            f"Either resume at the saved layout (actor.megatron.tensor_model_parallel_size={saved.tp}, "
            f"pipeline_model_parallel_size={saved.pp}, expert_model_parallel_size={saved.ep}"
            + (f", pipeline_parallel_num_layer_list={list(saved.num_layer_list)}" if saved.num_layer_list else "")
            + "), or convert the weights and start a new run at the new layout (the optimizer restarts): "
            f"python verl_patches/scripts/convert_ckpt_deepseek3.py --reverse --load-dir {where}/actor "
            "--save-dir <hf> --tokenizer-dir <model.path>, then convert_ckpt_deepseek3.py --load-dir <hf> "
            "--save-dir <mcore> with the new --target-*-parallel-size/--num-layer-list flags, and run with "
            "actor.megatron.dist_checkpointing_path=<mcore> trainer.resume_mode=disable")
    if saved.dp != running.dp:
        return f"data-parallel size changed {saved.dp} -> {running.dp} (supported: optimizer state is DP-gathered)"
    return ""
