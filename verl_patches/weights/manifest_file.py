"""The one strict reader of the manifests our weight tools (and the actor checkpoint) write beside their output.

``conversion_manifest.json`` (HF -> Megatron, and every actor checkpoint), ``export_manifest.json`` (Megatron ->
HF) and ``fp8_cast_manifest.json`` (FP8 -> BF16) record what a run wrote, so that a re-run resumes and
``--overwrite`` removes only those files. A manifest is read only from a regular file (not a symlink, FIFO or
folder) of bounded size, as UTF-8 JSON of a plausible depth, and every key this code uses is checked for
type and range; a name it lists must be a plain name of the kind the tool writes, so no manifest can point
a deletion or a read outside its folder. Every refusal is one line naming the file and the key.
Pure standard library (the preflight reads manifests without importing torch).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.weights.errors import ManifestError
from verl_patches.weights.layout import ParallelLayout

MAX_MANIFEST_BYTES = 16 << 20  # 671B's manifests are tens of kB (256 ranks or 163 shards and a config)
MAX_RANKS = 1 << 16  # TP x PP x EP of any plausible layout; bounds every loop over a manifest's layout
CONVERTER_TOOL = "verl_patches.weights.hf_to_mcore"
ACTOR_CHECKPOINT_TOOL = "verl_patches.checkpoint"  # an actor checkpoint's conversion_manifest.json
_SHA256 = re.compile(r"[0-9a-f]{64}")
_RANK_DIR = re.compile(r"mp_rank_\d{2}(_\d{3}){0,2}")
# a name in the folder itself: no separator, not hidden (nor '.'/'..'), no control character, one path component
_PLAIN_FILE = re.compile(r"[^./\x00-\x1f\x7f][^/\x00-\x1f\x7f]{0,254}")


def is_rank_dir_name(name: object) -> bool:
    """``mp_rank_TT[_PPP][_EEE]``: the only folder names a conversion manifest may list."""
    return isinstance(name, str) and bool(_RANK_DIR.fullmatch(name))


def is_plain_file_name(name: object) -> bool:
    """A file name in the output folder itself: one path component, not hidden, no control character."""
    return isinstance(name, str) and bool(_PLAIN_FILE.fullmatch(name))


def is_shard_file_name(name: object) -> bool:
    """A plain ``*.safetensors`` file name: the only shard names a manifest may list."""
    return is_plain_file_name(name) and name.endswith(".safetensors")


def _key(path: Path, key: str, problem: str) -> ManifestError:
    return ManifestError(f"{path}: key {key!r}: {problem}")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _shown(v: object) -> str:
    text = repr(v)
    return text[:60] + ("..." if len(text) > 60 else "")


def read_manifest_json(path: str | Path) -> dict[str, Any] | None:
    """The manifest at ``path`` as a JSON object, or None when there is no file (nor link) there."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    if path.is_symlink():
        raise ManifestError(f"{path}: is a symbolic link; a manifest is a regular file our tools write")
    try:
        data = read_regular_file(path, max_bytes=MAX_MANIFEST_BYTES, follow_symlinks=False)
    except FileRefused as e:
        raise ManifestError(f"corrupt manifest: {e}") from None
    try:
        obj = json.loads(data.decode("utf-8"))
    except json.JSONDecodeError as e:
        raise ManifestError(f"{path}: line {e.lineno}: corrupt manifest ({e.msg})") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: corrupt manifest (not UTF-8)") from None
    except (ValueError, RecursionError):  # a number beyond Python's digit limit, nesting beyond the stack
        raise ManifestError(f"{path}: corrupt manifest (a number or a nesting beyond any manifest)") from None
    if not isinstance(obj, dict):
        raise ManifestError(f"{path}: corrupt manifest (a JSON {type(obj).__name__}, not an object)")
    return obj


def parse_layout(value: object, path: Path, key: str = "layout") -> ParallelLayout:
    """A layout as ``ParallelLayout.to_json`` writes it, every field checked (positive sizes, booleans)."""
    if not isinstance(value, dict):
        raise _key(path, key, f"expected an object, got {_shown(value)}")
    sizes = {}
    for k in ("tp", "pp", "ep"):
        v = value.get(k)
        if not _is_int(v) or not 1 <= v <= MAX_RANKS:
            raise _key(path, f"{key}.{k}", f"expected an integer in 1..{MAX_RANKS}, got {_shown(v)}")
        sizes[k] = v
    if sizes["tp"] * sizes["pp"] * sizes["ep"] > MAX_RANKS:
        raise _key(path, key, f"TP x PP x EP = {sizes['tp'] * sizes['pp'] * sizes['ep']} ranks, more than {MAX_RANKS}")
    nll = value.get("num_layer_list")
    if nll is not None:
        if (
            not isinstance(nll, list)
            or len(nll) != sizes["pp"]
            or not all(_is_int(x) and 1 <= x <= MAX_RANKS for x in nll)
        ):
            raise _key(
                path, f"{key}.num_layer_list", f"expected null or {sizes['pp']} positive integers, got {_shown(nll)}"
            )
    flags = {}
    for k in ("moe_grouped_gemm", "moe_tp_extend_ep"):
        v = value.get(k, False)
        if not isinstance(v, bool):
            raise _key(path, f"{key}.{k}", f"expected true or false, got {_shown(v)}")
        flags[k] = v
    return ParallelLayout(
        tp=sizes["tp"], pp=sizes["pp"], ep=sizes["ep"], num_layer_list=tuple(nll) if nll else None, **flags
    )


def parse_file_entries(
    man: Mapping[str, Any], key: str, path: Path, name_ok: Callable[[object], bool], what: str
) -> dict[str, dict[str, Any]]:
    """``man[key]``: ``{name: {"size": int, "sha256": hex, ...}}`` with every name a plain ``what`` name."""
    table = man.get(key, {})
    if not isinstance(table, dict):
        raise _key(path, key, f"expected an object, got {_shown(table)}")
    out = {}
    for name, entry in table.items():
        if not name_ok(name):
            raise _key(
                path,
                f"{key}.{name[:60]}",
                f"not a {what} name this tool writes (a manifest cannot name a file outside its folder)",
            )
        if not isinstance(entry, dict):
            raise _key(path, f"{key}.{name}", f"expected an object, got {_shown(entry)}")
        size, sha = entry.get("size"), entry.get("sha256")
        if not _is_int(size) or size < 0:
            raise _key(path, f"{key}.{name}.size", f"expected a byte count, got {_shown(size)}")
        if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            raise _key(path, f"{key}.{name}.sha256", f"expected 64 hex digits, got {_shown(sha)}")
        out[name] = dict(entry)
    return out


def parse_file_list(man: Mapping[str, Any], key: str, path: Path) -> list[str]:
    """``man[key]``: the plain names of the other files a run wrote (index, config, tokenizer files)."""
    names = man.get(key, [])
    if not isinstance(names, list) or not all(is_plain_file_name(n) for n in names):
        bad = next((n for n in names if not is_plain_file_name(n)), names) if isinstance(names, list) else names
        raise _key(path, key, f"expected a list of plain file names in the folder, got {_shown(bad)}")
    return list(names)


@dataclass(frozen=True)
class ConversionManifest:
    """``conversion_manifest.json`` of a Megatron checkpoint folder: how it was laid out and from what config."""

    path: Path
    tool: str
    layout: ParallelLayout
    hf_config: dict[str, Any] | None
    complete: bool
    ranks: dict[str, dict[str, Any]] = field(default_factory=dict)  # the converter's rank files (size, sha256)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)


def parse_conversion_manifest(obj: Mapping[str, Any], path: Path) -> ConversionManifest:
    tool = obj.get("tool")
    if tool not in (CONVERTER_TOOL, ACTOR_CHECKPOINT_TOOL):
        raise _key(path, "tool", f"expected {CONVERTER_TOOL!r} or {ACTOR_CHECKPOINT_TOOL!r}, got {_shown(tool)}")
    layout = parse_layout(obj.get("layout"), path)
    cfg = obj.get("hf_config")
    if cfg is not None and not isinstance(cfg, dict):
        raise _key(path, "hf_config", f"expected an object or null, got {_shown(cfg)}")
    complete = obj.get("complete", False)
    if not isinstance(complete, bool):
        raise _key(path, "complete", f"expected true or false, got {_shown(complete)}")
    ranks = parse_file_entries(obj, "ranks", path, is_rank_dir_name, "rank folder")
    return ConversionManifest(path, tool, layout, cfg, complete, ranks, dict(obj))


def read_conversion_manifest(
    folder: str | Path, file_name: str = "conversion_manifest.json"
) -> ConversionManifest | None:
    """The folder's conversion manifest, strictly parsed; None when there is none."""
    path = Path(folder) / file_name
    obj = read_manifest_json(path)
    return None if obj is None else parse_conversion_manifest(obj, path)
