"""DeepSeek-V3 ``config.json`` for training: official values, a tiny variant, and validation.

The training config is the official DeepSeek-V3 config with two changes (vendor item J3):
``quantization_config`` removed (the weights are BF16 after ``fp8_cast_bf16``) and
``num_nextn_predict_layers`` = 0 (the MTP layer is not trained). The tiny variant has exactly the same keys
with small sizes, built by the same code, so that the local CPU profile and the tests exercise the same
architecture (MLA + dense first layers + grouped MoE with a shared expert).
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.base.regular_file import FileRefused, read_regular_file
from verl_patches.weights.errors import ConfigError
from verl_patches.weights.hf_dir import CONFIG_FILE

# Values of the official deepseek-ai/DeepSeek-V3 config.json, minus quantisation and MTP (J3).
# ``auto_map`` is left out on purpose: it points at remote-code files that a generated directory lacks;
# transformers >= 4.50 has the native ``deepseek_v3`` model type.
_OFFICIAL: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "aux_loss_alpha": 0.001,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "ep_size": 1,
    "first_k_dense_replace": 3,
    "hidden_act": "silu",
    "hidden_size": 7168,
    "initializer_range": 0.02,
    "intermediate_size": 18432,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 2048,
    "moe_layer_freq": 1,
    "n_group": 8,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 61,
    "num_key_value_heads": 128,
    "num_nextn_predict_layers": 0,
    "pretraining_tp": 1,
    "q_lora_rank": 1536,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
    "rope_theta": 10000,
    "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid",
    "seq_aux": True,
    "tie_word_embeddings": False,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 129280,
}

# Sizes of the tiny variant; every other key keeps its official value.
_TINY_SIZES: dict[str, Any] = {
    "num_hidden_layers": 4,
    "first_k_dense_replace": 1,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 8,
    "n_group": 4,
    "topk_group": 2,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
}

_POS_INT_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "n_routed_experts",
    "n_shared_experts",
    "n_group",
    "topk_group",
    "num_experts_per_tok",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "max_position_embeddings",
    "moe_layer_freq",
)
_NONNEG_INT_KEYS = ("first_k_dense_replace", "num_nextn_predict_layers", "bos_token_id", "eos_token_id")
_FLOAT_KEYS = ("rms_norm_eps", "routed_scaling_factor", "rope_theta", "aux_loss_alpha")
_BOOL_KEYS = ("norm_topk_prob", "seq_aux", "tie_word_embeddings")
_STR_KEYS = {
    "model_type": ("deepseek_v3",),
    "topk_method": ("noaux_tc", "greedy", "group_limited_greedy"),
    "scoring_func": ("sigmoid", "softmax"),
    "hidden_act": None,
}
# Upper bounds far beyond any model these tools handle (DeepSeek-V3: hidden 7168, 61 layers, 256 experts,
# vocabulary 129280): a config past them is a typo or an attack, and its shapes would overflow int64 sizes or
# make planning loops over layers x experts run for hours before anything is read.
_MAX_INT = {
    "hidden_size": 1 << 17,
    "intermediate_size": 1 << 20,
    "moe_intermediate_size": 1 << 20,
    "num_hidden_layers": 1 << 12,
    "num_attention_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "n_routed_experts": 1 << 12,
    "n_shared_experts": 1 << 8,
    "n_group": 1 << 12,
    "topk_group": 1 << 12,
    "num_experts_per_tok": 1 << 12,
    "q_lora_rank": 1 << 17,
    "kv_lora_rank": 1 << 17,
    "qk_nope_head_dim": 1 << 12,
    "qk_rope_head_dim": 1 << 12,
    "v_head_dim": 1 << 12,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 30,
    "moe_layer_freq": 1 << 12,
    "first_k_dense_replace": 1 << 12,
    "num_nextn_predict_layers": 1 << 8,
    "bos_token_id": 1 << 31,
    "eos_token_id": 1 << 31,
}
_MAX_EXPERT_TENSORS = 1 << 16  # num_hidden_layers x n_routed_experts (DeepSeek-V3: 15616)
MAX_CONFIG_BYTES = 16 << 20
_YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def official_config() -> dict[str, Any]:
    """The DeepSeek-V3 671B training config (a fresh copy)."""
    return copy.deepcopy(_OFFICIAL)


def make_training_config(source: Mapping[str, Any] | None = None, where: str = "built-in") -> dict[str, Any]:
    """``source`` (or the official config) with quantisation and MTP removed, validated.

    Every other key of ``source`` is kept as it is, so an official HF config turns into the training
    config without hand edits.
    """
    cfg = copy.deepcopy(dict(source)) if source is not None else official_config()
    cfg.pop("quantization_config", None)
    cfg["num_nextn_predict_layers"] = 0
    validate_config(cfg, where=where, training=True)
    return cfg


def make_tiny_config(vocab_size: int = 512, **overrides: Any) -> dict[str, Any]:
    """A DeepSeek-V3-shaped config with small sizes (same keys as the official one), validated.

    ``vocab_size`` should equal the size of the locally built tokenizer; any other key may be overridden,
    e.g. ``make_tiny_config(1024, num_hidden_layers=6, first_k_dense_replace=2, n_routed_experts=16)``.
    """
    cfg = official_config()
    cfg.update(copy.deepcopy(_TINY_SIZES))
    cfg["vocab_size"] = vocab_size
    for key, value in overrides.items():
        if key not in cfg and key not in ("quantization_config",):
            raise ConfigError(f"make_tiny_config: unknown key {key!r} (not a DeepSeek-V3 config key)")
        cfg[key] = copy.deepcopy(value)
    validate_config(cfg, where="tiny config", training=True)
    return cfg


def _fail(where: str, key: str, msg: str) -> None:
    raise ConfigError(f"{where}: key {key!r}: {msg}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _non_finite_key(value: Any, key: str = "") -> str | None:
    """The dotted key of the first non-finite float anywhere in a config value, or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return key or "(value)"
    if isinstance(value, Mapping):
        for k, v in value.items():
            found = _non_finite_key(v, f"{key}.{k}" if key else str(k))
            if found is not None:
                return found
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            found = _non_finite_key(v, f"{key}[{i}]")
            if found is not None:
                return found
    return None


def validate_config(cfg: Mapping[str, Any], where: str = "config", training: bool = False) -> None:
    """Check keys, types and arithmetic; raise ``ConfigError`` naming the first offending key.

    ``training=True`` additionally requires the training form (no quantisation, no MTP).
    """
    for key in _POS_INT_KEYS:
        if key not in cfg:
            _fail(where, key, "missing")
        if not _is_int(cfg[key]) or cfg[key] <= 0:
            _fail(where, key, f"must be a positive integer, got {cfg[key]!r}")
    for key in _NONNEG_INT_KEYS:
        if key not in cfg:
            _fail(where, key, "missing")
        if not _is_int(cfg[key]) or cfg[key] < 0:
            _fail(where, key, f"must be a non-negative integer, got {cfg[key]!r}")
    for key, bound in _MAX_INT.items():
        if key in cfg and cfg[key] > bound:
            _fail(where, key, f"{cfg[key]} is beyond any model these tools handle (at most {bound})")
    if cfg["num_hidden_layers"] * cfg["n_routed_experts"] > _MAX_EXPERT_TENSORS:
        _fail(
            where,
            "n_routed_experts",
            f"num_hidden_layers x n_routed_experts = "
            f"{cfg['num_hidden_layers'] * cfg['n_routed_experts']} experts, beyond any "
            f"model these tools handle (at most {_MAX_EXPERT_TENSORS})",
        )
    for key in _FLOAT_KEYS:
        if key not in cfg:
            _fail(where, key, "missing")
        if isinstance(cfg[key], bool) or not isinstance(cfg[key], (int, float)):
            _fail(where, key, f"must be a number, got {cfg[key]!r}")
    for key in _BOOL_KEYS:
        if key not in cfg:
            _fail(where, key, "missing")
        if not isinstance(cfg[key], bool):
            _fail(where, key, f"must be true or false, got {cfg[key]!r}")
    for key, allowed in _STR_KEYS.items():
        if key not in cfg:
            _fail(where, key, "missing")
        if not isinstance(cfg[key], str) or (allowed is not None and cfg[key] not in allowed):
            _fail(
                where,
                key,
                f"must be one of {allowed}, got {cfg[key]!r}" if allowed else f"must be a string, got {cfg[key]!r}",
            )
    bad = _non_finite_key(cfg)
    if bad is not None:  # json.dumps writes NaN/Infinity, which transformers and vLLM then compute with
        _fail(where, bad, "must be a finite number, got a non-finite value")
    arch = cfg.get("architectures")
    if not isinstance(arch, list) or "DeepseekV3ForCausalLM" not in arch:
        _fail(where, "architectures", f"must be a list containing 'DeepseekV3ForCausalLM', got {arch!r}")

    rs = cfg.get("rope_scaling")
    if rs is not None:
        if not isinstance(rs, dict):
            _fail(where, "rope_scaling", f"must be an object or null, got {rs!r}")
        kind = rs.get("type", rs.get("rope_type"))
        if kind == "yarn":
            for k in _YARN_KEYS:
                if k not in rs:
                    _fail(where, f"rope_scaling.{k}", "missing (required for yarn)")
                if isinstance(rs[k], bool) or not isinstance(rs[k], (int, float)):
                    _fail(where, f"rope_scaling.{k}", f"must be a number, got {rs[k]!r}")

    e, g = cfg["n_routed_experts"], cfg["n_group"]
    if e % g:
        _fail(where, "n_group", f"n_routed_experts={e} is not divisible by n_group={g}")
    if cfg["topk_group"] > g:
        _fail(where, "topk_group", f"topk_group={cfg['topk_group']} exceeds n_group={g}")
    if cfg["num_experts_per_tok"] > cfg["topk_group"] * (e // g):
        _fail(
            where,
            "num_experts_per_tok",
            f"{cfg['num_experts_per_tok']} exceeds the experts reachable in topk_group groups "
            f"({cfg['topk_group']} x {e // g})",
        )
    if cfg["topk_method"] == "noaux_tc" and e // g < 2:
        _fail(where, "n_group", "noaux_tc scores a group by its top-2 experts: need >= 2 experts per group")
    if cfg["num_attention_heads"] % cfg["num_key_value_heads"]:
        _fail(
            where,
            "num_key_value_heads",
            f"num_attention_heads={cfg['num_attention_heads']} is not a multiple of it ({cfg['num_key_value_heads']})",
        )
    if cfg["qk_rope_head_dim"] % 2:
        _fail(where, "qk_rope_head_dim", f"must be even for rotary embedding, got {cfg['qk_rope_head_dim']}")
    if cfg["first_k_dense_replace"] > cfg["num_hidden_layers"]:
        _fail(
            where,
            "first_k_dense_replace",
            f"{cfg['first_k_dense_replace']} exceeds num_hidden_layers={cfg['num_hidden_layers']}",
        )
    if cfg["moe_layer_freq"] != 1:
        _fail(
            where,
            "moe_layer_freq",
            f"only 1 (every layer after the dense ones is MoE) is supported, got {cfg['moe_layer_freq']}",
        )
    if training:
        if "quantization_config" in cfg:
            _fail(where, "quantization_config", "must be absent in the training config (weights are BF16)")
        if cfg["num_nextn_predict_layers"] != 0:
            _fail(
                where,
                "num_nextn_predict_layers",
                f"must be 0 in the training config (no MTP), got {cfg['num_nextn_predict_layers']}",
            )


def resolve_config_path(path: str | Path) -> Path:
    """``path`` itself if it is a file, else ``path/config.json``."""
    p = Path(path)
    return p / CONFIG_FILE if p.is_dir() else p


def read_config_json(path: str | Path) -> dict[str, Any]:
    """Parse a config.json (file or directory) without validating it; errors name the file and line."""

    p = resolve_config_path(path)
    if not p.exists():
        raise ConfigError(f"{p}: config file not found")
    try:
        data = json.loads(read_regular_file(p, max_bytes=MAX_CONFIG_BYTES).decode("utf-8"))
    except FileRefused as err:
        raise ConfigError(str(err)) from None
    except json.JSONDecodeError as err:
        raise ConfigError(f"{p}: line {err.lineno}: invalid JSON: {err.msg}") from None
    except (RecursionError, UnicodeDecodeError):
        raise ConfigError(f"{p}: not UTF-8 JSON of a plausible depth") from None
    except ValueError:  # an integer beyond Python's digit limit
        raise ConfigError(f"{p}: a number beyond any config value") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: top level must be a JSON object")
    return data


def load_config(path: str | Path, training: bool = False) -> dict[str, Any]:
    """Read and validate a DeepSeek-V3 config.json (file or directory)."""
    cfg = read_config_json(path)
    validate_config(cfg, where=str(resolve_config_path(path)), training=training)
    return cfg


def config_to_json(cfg: Mapping[str, Any]) -> str:
    return json.dumps(dict(sorted(cfg.items())), indent=2) + "\n"
