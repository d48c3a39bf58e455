"""Pure: the training layout a checkpoint was written at, per-rank records, and the step manifest.

Every rank writes a record of what it saved (``ranks/rank_RRRRR.json``: sizes and sha256s); the driver
turns the records into the step manifest only when they describe one complete, consistent save (all ranks
of one layout, every file present with its recorded size and digest). Both are read by strict parsers
(`parse_rank_record`, `parse_manifest`): strict JSON, a checked schema, file names confined to their
folder; anything else is one CheckpointIncomplete line naming the file and key. Resuming compares the saved
layout with the running one: a change of the data-parallel size alone is supported (model shards are per
model-parallel rank and the distributed optimizer's state is saved gathered over DP); any other change is an
error naming both layouts and the supported conversion.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from verl_patches.checkpoint.confine import ConfinementError, check_name, check_relpath
from verl_patches.checkpoint.strict_json import StrictJsonError, loads_strict

MANIFEST_FILE = "checkpoint.json"
MANIFEST_VERSION = 3  # 2: a sha256 per file; 3: signed with the run's secret
SIGNATURE_KEY = "signature"
SIGNATURE_ALG = "hmac_sha256"
RANKS_DIR = "ranks"
MAX_STEP = 10**12 - 1  # as the tracker's 12 digits
MAX_MANIFEST_BYTES = 64 << 20
MAX_RANK_RECORD_BYTES = 4 << 20
_MAX_PARALLEL = 1 << 20
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CheckpointIncomplete(Exception):
    """A save did not produce every file it should have, or a file describing it is unusable; the message
    names the rank, file and key."""


class LayoutChangeError(Exception):
    """The running layout cannot load this checkpoint; the message names both layouts and the way out."""


def _int(d: Mapping[str, Any], key: str, where: str, lo: int, hi: int, default: int | None = None) -> int:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise CheckpointIncomplete(f"{where}: key {key!r} must be an integer in {lo}..{hi}, got {str(v)[:40]!r}")
    return v


def _bool(d: Mapping[str, Any], key: str, where: str, default: bool) -> bool:
    v = d.get(key, default)
    if not isinstance(v, bool):
        raise CheckpointIncomplete(f"{where}: key {key!r} must be true or false, got {str(v)[:40]!r}")
    return v


def _dict(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise CheckpointIncomplete(f"{where}: expected a JSON object, got {type(v).__name__}")
    return v


def _relpath(rel: Any, where: str) -> str:
    try:
        return check_relpath(rel, where)
    except ConfinementError as err:
        raise CheckpointIncomplete(str(err)) from None


def _sha256(v: Any, where: str) -> str:
    if not isinstance(v, str) or not _SHA256_RE.match(v):
        raise CheckpointIncomplete(f"{where}: expected a sha256 (64 lowercase hex digits), got {str(v)[:70]!r}")
    return v


@dataclass(frozen=True)
class FileRecord:
    """A file of a committed step: its size and sha256 when it was saved."""

    size: int
    sha256: str

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.size, "sha256": self.sha256}

    @classmethod
    def from_json(cls, d: Any, where: str) -> FileRecord:
        d = _dict(d, where)
        if set(d) != {"bytes", "sha256"}:
            raise CheckpointIncomplete(f"{where}: expected keys 'bytes' and 'sha256', got {sorted(d)[:4]}")
        return cls(size=_int(d, "bytes", where, 0, 1 << 62), sha256=_sha256(d["sha256"], f"{where}: sha256"))


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
    def from_json(cls, d: Any, where: str = "layout") -> TrainLayout:
        d = _dict(d, where)
        unknown = sorted(set(d) - {f for f in cls.__dataclass_fields__})
        if unknown:
            raise CheckpointIncomplete(f"{where}: unknown key {unknown[0][:40]!r}")
        nll = d.get("num_layer_list")
        if nll is not None and (
            not isinstance(nll, list)
            or len(nll) > 4096
            or any(isinstance(x, bool) or not isinstance(x, int) or not 0 <= x <= 1 << 20 for x in nll)
        ):
            raise CheckpointIncomplete(f"{where}: key 'num_layer_list' must be null or a list of layer counts")
        return cls(
            tp=_int(d, "tp", where, 1, _MAX_PARALLEL),
            pp=_int(d, "pp", where, 1, _MAX_PARALLEL),
            ep=_int(d, "ep", where, 1, _MAX_PARALLEL),
            dp=_int(d, "dp", where, 1, _MAX_PARALLEL),
            cp=_int(d, "cp", where, 1, _MAX_PARALLEL, 1),
            num_layer_list=tuple(nll) if nll else None,
            moe_tp_extend_ep=_bool(d, "moe_tp_extend_ep", where, False),
            use_distributed_optimizer=_bool(d, "use_distributed_optimizer", where, True),
        )


@dataclass(frozen=True)
class RankRecord:
    """What one rank wrote: its place in the layout and its files (path relative to the role folder -> bytes,
    and -> sha256)."""

    rank: int
    layout: TrainLayout
    tp_rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    files: Mapping[str, int] = field(default_factory=dict)
    sha256: Mapping[str, str] = field(default_factory=dict)

    @property
    def model_parallel_coords(self) -> tuple[int, int, int]:
        return (self.tp_rank, self.pp_rank, self.ep_rank)

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "layout": self.layout.to_json(),
            "tp_rank": self.tp_rank,
            "pp_rank": self.pp_rank,
            "ep_rank": self.ep_rank,
            "dp_rank": self.dp_rank,
            "files": dict(sorted(self.files.items())),
            "sha256": dict(sorted(self.sha256.items())),
        }

    @classmethod
    def from_json(cls, d: Any, where: str = "rank record") -> RankRecord:
        d = _dict(d, where)
        files = _dict(d.get("files"), f"{where}: key 'files'")
        digests = _dict(d.get("sha256", {}), f"{where}: key 'sha256'")
        return cls(
            rank=_int(d, "rank", where, 0, 1 << 31),
            layout=TrainLayout.from_json(d.get("layout"), f"{where}: layout"),
            tp_rank=_int(d, "tp_rank", where, 0, _MAX_PARALLEL),
            pp_rank=_int(d, "pp_rank", where, 0, _MAX_PARALLEL),
            ep_rank=_int(d, "ep_rank", where, 0, _MAX_PARALLEL),
            dp_rank=_int(d, "dp_rank", where, 0, 1 << 31),
            files={_relpath(k, where): _int(files, k, f"{where}: files", 0, 1 << 62) for k in files},
            sha256={_relpath(k, where): _sha256(v, f"{where}: sha256 of {k[:80]!r}") for k, v in digests.items()},
        )


def parse_rank_record(data: bytes | str, where: str) -> RankRecord:
    try:
        return RankRecord.from_json(loads_strict(data, where), where)
    except StrictJsonError as err:
        raise CheckpointIncomplete(str(err)) from None


def rank_record_name(rank: int) -> str:
    return f"{RANKS_DIR}/rank_{rank:05d}.json"


def check_rank_records(role: str, records: Iterable[RankRecord], sizes: Mapping[str, int | None]) -> TrainLayout:
    """The layout all records agree on, after checking the save is complete.

    ``sizes`` maps every file a record names (relative to the role folder) to its size on disk, or None
    when missing. Every file a rank wrote must carry its sha256. Raises CheckpointIncomplete naming the
    first rank and file at fault.
    """
    records = sorted(records, key=lambda r: r.rank)
    if not records:
        raise CheckpointIncomplete(f"{role}: no rank wrote a record ({RANKS_DIR}/rank_*.json)")
    layout = records[0].layout
    for r in records:
        if r.layout != layout:
            raise CheckpointIncomplete(
                f"{role}: rank {r.rank} saved at {r.layout.describe()}, rank {records[0].rank} at {layout.describe()}"
            )
    seen = [r.rank for r in records]
    missing = sorted(set(range(layout.world_size)) - set(seen))
    if missing or len(seen) != len(set(seen)) or seen[-1] >= layout.world_size:
        raise CheckpointIncomplete(
            f"{role}: rank records {seen} do not cover ranks 0..{layout.world_size - 1} of "
            f"{layout.describe()} (missing {missing[:8]})"
        )
    for r in records:
        for name, size in sorted(r.files.items()):
            have = sizes.get(name)
            if have is None:
                raise CheckpointIncomplete(f"{role}: rank {r.rank}: {name} is missing")
            if have != size:
                raise CheckpointIncomplete(f"{role}: rank {r.rank}: {name} has {have} bytes, the rank wrote {size}")
            if name not in r.sha256:
                raise CheckpointIncomplete(f"{role}: rank {r.rank}: {name} has no sha256 in its record")
    return layout


@dataclass(frozen=True)
class StepManifest:
    """A committed step: its number, each role's layout (None for a role whose workers keep no rank records),
    every file (relative to the step folder) with its size and sha256, and the trainer's extra keys."""

    step: int
    roles: Mapping[str, TrainLayout | None]
    files: Mapping[str, FileRecord]
    extra: Mapping[str, Any] = field(default_factory=dict)
    signature: str = ""  # as read: the HMAC-SHA256 of `content`, to be checked with the run's secret
    content: bytes = b""  # what the signature covers: `manifest_content` of the manifest as read

    def role_files(self, role: str) -> dict[str, FileRecord]:
        """The files of ``role``, relative to its folder."""
        prefix = f"{role}/"
        return {k[len(prefix) :]: v for k, v in self.files.items() if k.startswith(prefix)}


_MANIFEST_KEYS = ("version", "step", "roles", "files", SIGNATURE_KEY)
_SIGNATURE_RE = re.compile(r"^[0-9a-f]{64}$")


def manifest_content(raw: Mapping[str, Any]) -> bytes:
    """The bytes a manifest's signature covers: every key but the signature, as canonical JSON (sorted keys,
    no spaces, ASCII), so the signer and the reader agree whatever the file's layout."""
    body = {k: v for k, v in raw.items() if k != SIGNATURE_KEY}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def with_signature(raw: Mapping[str, Any], signature: str) -> dict[str, Any]:
    """``raw`` (a `manifest_json`) with its signature, the HMAC of `manifest_content` ``raw``."""
    if not _SIGNATURE_RE.match(signature):
        raise ValueError("a manifest signature is 64 lowercase hex digits")
    return {**{k: v for k, v in raw.items() if k != SIGNATURE_KEY}, SIGNATURE_KEY: {SIGNATURE_ALG: signature}}


def manifest_json(
    step: int,
    roles: Mapping[str, TrainLayout | None],
    files: Mapping[str, FileRecord],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The step manifest's JSON, unsigned (`with_signature`): step, each role's layout, every file's size and
    sha256, extra keys."""
    extra = dict(extra or {})
    clash = set(extra) & set(_MANIFEST_KEYS)
    if clash:
        raise ValueError(f"manifest extra keys {sorted(clash)} clash with the manifest's own")
    return {
        "version": MANIFEST_VERSION,
        "step": step,
        "roles": {k: (v.to_json() if v is not None else None) for k, v in sorted(roles.items())},
        "files": {k: v.to_json() for k, v in sorted(files.items())},
        **extra,
    }


def parse_manifest(data: bytes | str, where: str) -> StepManifest:
    """The step manifest from its bytes; CheckpointIncomplete, one line naming ``where`` and the key at fault.

    File names must stay inside the step folder (relative, no '..'); the manifest does not list itself. The
    signature is read, not checked: that takes the run's secret (`commit.read_manifest` does it).
    """
    try:
        raw = loads_strict(data, where)
    except StrictJsonError as err:
        raise CheckpointIncomplete(str(err)) from None
    raw = _dict(raw, where)
    if "version" not in raw or raw["version"] != MANIFEST_VERSION:
        got = raw.get("version")
        raise CheckpointIncomplete(f"{where}: manifest version {str(got)[:20]}, this code reads {MANIFEST_VERSION}")
    for key, typ in (("step", int), ("roles", dict), ("files", dict)):
        if not isinstance(raw.get(key), typ) or isinstance(raw.get(key), bool):
            raise CheckpointIncomplete(f"{where}: key {key!r} missing or not a {typ.__name__}")
    step = _int(raw, "step", where, 0, MAX_STEP)
    roles: dict[str, TrainLayout | None] = {}
    for name, lay in raw["roles"].items():
        try:
            check_name(name, f"{where}: roles")
        except ConfinementError as err:
            raise CheckpointIncomplete(str(err)) from None
        roles[name] = None if lay is None else TrainLayout.from_json(lay, f"{where}: roles.{name}")
    files: dict[str, FileRecord] = {}
    for rel, rec in raw["files"].items():
        _relpath(rel, f"{where}: files")
        if rel == MANIFEST_FILE:
            raise CheckpointIncomplete(f"{where}: files: lists the manifest itself")
        files[rel] = FileRecord.from_json(rec, f"{where}: files.{rel[:80]}")
    sig = raw.get(SIGNATURE_KEY)
    if not isinstance(sig, dict) or set(sig) != {SIGNATURE_ALG} or not _SIGNATURE_RE.match(str(sig[SIGNATURE_ALG])):
        raise CheckpointIncomplete(
            f"{where}: key {SIGNATURE_KEY!r} missing or not {{{SIGNATURE_ALG!r}: 64 hex digits}} (unsigned: not a "
            "step this code saved)"
        )
    extra = {k: v for k, v in raw.items() if k not in _MANIFEST_KEYS}
    try:
        content = manifest_content(raw)
    except ValueError:  # a non-finite number: never one we signed
        raise CheckpointIncomplete(f"{where}: holds a non-finite number; not a manifest this code wrote") from None
    return StepManifest(
        step=step, roles=roles, files=files, extra=extra, signature=str(sig[SIGNATURE_ALG]), content=content
    )


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
            "actor.megatron.dist_checkpointing_path=<mcore> trainer.resume_mode=disable"
        )
    if saved.dp != running.dp:
        return f"data-parallel size changed {saved.dp} -> {running.dp} (supported: optimizer state is DP-gathered)"
    return ""
