"""Preflight: the files a job reads — training data, model config and tokenizer, Megatron checkpoint.

A path that is missing on a host that does not run the job (a CPU machine checking an A3 profile, whose
data and weights live on the cluster's storage) is "not checked here"; a path that exists is checked
wherever the preflight runs; a path missing where the job runs is a failure. The tiny profile builds its
assets on first use, so their absence is expected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_patches.checkpoint.tracker import TrackerError, read_megatron_tracker
from verl_patches.launch.preflight.findings import FAIL, NOT_CHECKED, OK, WARN, Context, Finding, get
from verl_patches.weights.config import make_tiny_config, official_config, read_config_json, validate_config
from verl_patches.weights.errors import ConfigError, ManifestError
from verl_patches.weights.layout import ParallelLayout, all_ranks, rank_dir_name
from verl_patches.weights.manifest_file import read_conversion_manifest

# Names MindSpeed-LLM's loader reads; the same constants as verl_patches.weights.hf_to_mcore (which
# imports torch, too heavy for a preflight), kept equal by a test.
TRACKER_FILE = "latest_checkpointed_iteration.txt"
CKPT_FILE = "model_optim_rng.pt"
CONVERSION_MANIFEST = "conversion_manifest.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def _abs(ctx: Context, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else ctx.root / p


def _is_tiny_asset(ctx: Context, path: Path) -> bool:
    base = ctx.overlay.tiny_assets_dir
    if ctx.overlay.profile != "tiny" or not base:
        return False
    try:
        path.resolve().relative_to(_abs(ctx, base).resolve())
        return True
    except ValueError:
        return False


def missing_path(ctx: Context, check: str, path: Path, what: str, key: str) -> Finding:
    if _is_tiny_asset(ctx, path):
        return Finding(check, OK, f"{path} not built yet: the tiny profile builds it on first use")
    if not ctx.authoritative:
        return Finding(
            check,
            NOT_CHECKED,
            f"{what} {path} is not on this host (it lives on the cluster's storage); checked there",
            key,
        )
    return Finding(check, FAIL, f"{what} {path} does not exist", key)


# ---- data ----------------------------------------------------------------------------------------


def schema_problems(schema: Any, prompt_key: str = "prompt") -> list[str]:
    """What a verl v0.4.0 RL parquet lacks (the columns RLHFDataset and the reward managers read)."""
    # lazy: pyarrow is heavy and only this path needs it; importing this module stays light
    import pyarrow as pa

    def is_str(t: Any) -> bool:
        return pa.types.is_string(t) or pa.types.is_large_string(t)

    problems = []
    names = set(schema.names)
    for col in ("data_source", prompt_key, "ability", "reward_model", "extra_info"):
        if col not in names:
            problems.append(f"column {col!r} missing")
    if "data_source" in names and not is_str(schema.field("data_source").type):
        problems.append(f"data_source is {schema.field('data_source').type}, expected string")
    if "ability" in names and not is_str(schema.field("ability").type):
        problems.append(f"ability is {schema.field('ability').type}, expected string")
    if prompt_key in names:
        t = schema.field(prompt_key).type
        ok = (
            (pa.types.is_list(t) or pa.types.is_large_list(t))
            and pa.types.is_struct(t.value_type)
            and all(
                t.value_type.get_field_index(f) >= 0 and is_str(t.value_type.field(f).type) for f in ("role", "content")
            )
        )
        if not ok:
            problems.append(f"{prompt_key} is {t}, expected list<struct<role: string, content: string>>")
    if "reward_model" in names:
        t = schema.field("reward_model").type
        if not pa.types.is_struct(t) or any(t.get_field_index(f) < 0 for f in ("ground_truth", "style")):
            problems.append(f"reward_model is {t}, expected struct<ground_truth, style>")
    if "extra_info" in names and not pa.types.is_struct(schema.field("extra_info").type):
        problems.append(f"extra_info is {schema.field('extra_info').type}, expected a struct")
    return problems


def _files(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


def parquet_rows(ctx: Context, key: str) -> int | None:
    """Rows of the parquet files config ``key`` lists (their metadata only), None when it lists none or one is not
    readable on this host (`data_findings` says why)."""
    # lazy: pyarrow is heavy and only this path needs it; importing this module stays light
    import pyarrow.parquet as pq

    files = _files(get(ctx.cfg, key))
    total = 0
    for f in files:
        try:
            total += pq.ParquetFile(_abs(ctx, f)).metadata.num_rows
        except Exception:  # noqa: BLE001  (missing or unreadable: data_findings reports it)
            return None
    return total if files else None


def data_findings(ctx: Context) -> list[Finding]:
    # lazy: pyarrow is heavy and only this path needs it; importing this module stays light
    import pyarrow.parquet as pq

    out = []
    prompt_key = get(ctx.cfg, "data.prompt_key") or "prompt"
    tbs = int(get(ctx.cfg, "data.train_batch_size"))
    suffix = " (DATA_DIR)" if ctx.cluster_profile else ""
    for key in ("data.train_files", "data.val_files"):
        files = _files(get(ctx.cfg, key))
        if not files:
            out.append(Finding("data.files", FAIL, f"{key} is empty", key))
            continue
        rows = 0
        for f in files:
            path = _abs(ctx, f)
            if not path.is_file():
                out.append(missing_path(ctx, "data.files", path, "data file", key + suffix))
                rows = -1
                continue
            try:
                meta = pq.ParquetFile(path)
                problems = schema_problems(meta.schema_arrow, prompt_key)
                n = meta.metadata.num_rows
            except Exception as e:  # noqa: BLE001  (any unreadable file is the same finding)
                out.append(Finding("data.schema", FAIL, f"{path}: not a readable parquet file ({e})", key))
                rows = -1
                continue
            if problems:
                out.append(
                    Finding(
                        "data.schema",
                        FAIL,
                        f"{path}: {'; '.join(problems)} (regenerate with verl_patches/scripts/json_to_parquet.py)",
                        key + suffix,
                    )
                )
                rows = -1
                continue
            out.append(Finding("data.schema", OK, f"{path}: verl RL schema, {n} rows"))
            rows = rows + n if rows >= 0 else rows
        if key == "data.train_files" and 0 <= rows < tbs:
            out.append(
                Finding(
                    "data.rows",
                    FAIL,
                    f"{rows} training rows < data.train_batch_size {tbs}: the "
                    f"dataloader (drop_last) would yield no step",
                    "data.train_batch_size",
                )
            )
    return out


# ---- model ---------------------------------------------------------------------------------------


def model_findings(ctx: Context) -> tuple[list[Finding], dict[str, Any]]:
    """(findings, the HF config dict the arithmetic uses)."""

    key = "actor_rollout_ref.model.path" + (" (MODEL_PATH)" if ctx.cluster_profile else "")
    fallback = official_config() if ctx.cluster_profile else make_tiny_config()
    fallback_name = "the official DeepSeek-V3 config (J3)" if ctx.cluster_profile else "make_tiny_config()"
    raw = get(ctx.cfg, "actor_rollout_ref.model.path")
    if not raw:
        return [Finding("model.config", FAIL, "actor_rollout_ref.model.path is not set", key)], fallback
    path = _abs(ctx, str(raw))
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        f = missing_path(ctx, "model.config", cfg_file, "model config", key)
        f = Finding(f.check, f.status, f.message + f"; layout and memory use {fallback_name}", f.key)
        return [f], fallback
    try:
        model = read_config_json(cfg_file)
        validate_config(model, where=str(cfg_file), training=True)
    except ConfigError as e:
        return [Finding("model.config", FAIL, f"{e}; layout and memory use {fallback_name}", key)], fallback
    out = [
        Finding(
            "model.config",
            OK,
            f"{cfg_file}: valid DeepSeek-V3 training config "
            f"({model['num_hidden_layers']} layers, {model['n_routed_experts']} experts)",
        )
    ]
    if not any((path / t).is_file() for t in TOKENIZER_FILES):
        out.append(Finding("model.tokenizer", FAIL, f"{path} has no tokenizer ({', '.join(TOKENIZER_FILES)})", key))
    else:
        out.append(Finding("model.tokenizer", OK, f"tokenizer files in {path}"))
    return out, model


# ---- Megatron checkpoint -------------------------------------------------------------------------


def checkpoint_findings(ctx: Context, model: dict[str, Any]) -> list[Finding]:
    m = "actor_rollout_ref.actor.megatron"
    if not ctx.megatron:
        return []
    if not (get(ctx.cfg, "actor_rollout_ref.actor.load_weight") and get(ctx.cfg, f"{m}.use_dist_checkpointing")):
        return [
            Finding(
                "checkpoint.dist",
                OK,
                "no Megatron checkpoint is loaded (load_weight or use_dist_checkpointing "
                "is off: random initialisation)",
            )
        ]
    key = f"DIST_CKPT_PATH / {m}.dist_checkpointing_path"
    raw = get(ctx.cfg, f"{m}.dist_checkpointing_path")
    if not raw:
        if ctx.host.is_npu or not ctx.cluster_profile:
            return [
                Finding(
                    "checkpoint.dist",
                    FAIL,
                    "the true-weight run loads a Megatron checkpoint but DIST_CKPT_PATH is not set",
                    key,
                )
            ]
        return [
            Finding(
                "checkpoint.dist",
                NOT_CHECKED,
                "DIST_CKPT_PATH is not set on this host; the true-weight run "
                "needs it on the cluster (--dist-ckpt-path or the env file)",
                key,
            )
        ]
    root = _abs(ctx, str(raw))
    if not root.is_dir():
        return [missing_path(ctx, "checkpoint.dist", root, "Megatron checkpoint", key)]

    tracker = root / TRACKER_FILE
    if not tracker.exists() and not tracker.is_symlink():
        return [
            Finding(
                "checkpoint.dist",
                FAIL,
                f"{tracker} missing: not a Megatron checkpoint (or its conversion did not finish)",
                key,
            )
        ]
    try:  # the one strict tracker reader: a link, a FIFO, '²' or 5000 digits are one line, nothing echoed
        it = read_megatron_tracker(tracker)
    except TrackerError as e:
        return [Finding("checkpoint.dist", FAIL, str(e), key)]
    it_dir = root / ("release" if it == "release" else f"iter_{it:07d}")
    if ctx.layout is None:
        return [Finding("checkpoint.dist", WARN, "rank folders not compared: the layout is refused (see layout.*)", "")]
    training = ctx.layout.training
    lst = get(ctx.cfg, f"{m}.pipeline_parallel_num_layer_list")
    layout = ParallelLayout(
        tp=training.tp,
        pp=training.pp,
        ep=training.ep,
        num_layer_list=tuple(int(x) for x in lst) if lst else None,
        moe_grouped_gemm=True,
        moe_tp_extend_ep=True,
    )
    expected = {rank_dir_name(layout, r) for r in all_ranks(layout)}
    found = (
        {p.name for p in it_dir.iterdir() if p.is_dir() and p.name.startswith("mp_rank_")} if it_dir.is_dir() else set()
    )
    missing = sorted(n for n in expected if not (it_dir / n / CKPT_FILE).is_file())
    extra = sorted(found - expected)
    problems = []
    if missing:
        problems.append(
            f"{len(missing)} of {len(expected)} rank files missing (e.g. {it_dir.name}/{missing[0]}/{CKPT_FILE})"
        )
    if extra:
        problems.append(f"rank folders of another layout: {', '.join(extra[:3])}")
    try:  # the converters' own strict manifest reader (types, ranges, names confined to the folder)
        manifest = read_conversion_manifest(root, CONVERSION_MANIFEST)
    except ManifestError as e:
        manifest = None
        problems.append(str(e))
    if manifest is not None:
        saved, want = manifest.layout.to_json(), layout.to_json()
        diff = [
            f"{k}={saved[k]!r} (config {want[k]!r})"
            for k in ("tp", "pp", "ep", "num_layer_list", "moe_tp_extend_ep")
            if saved[k] != want[k]
        ]
        if diff:
            problems.append(f"converted for another layout: {', '.join(diff)}")
    if problems:
        return [
            Finding(
                "checkpoint.dist",
                FAIL,
                f"{root}: " + "; ".join(problems) + f" (expected TP{layout.tp} PP{layout.pp} "
                f"EP{layout.ep}: {len(expected)} mp_rank_* folders)",
                key,
            )
        ]
    return [
        Finding(
            "checkpoint.dist",
            OK,
            f"{root}: {it_dir.name} has all {len(expected)} rank files for TP{layout.tp} PP{layout.pp} EP{layout.ep}",
        )
    ]
