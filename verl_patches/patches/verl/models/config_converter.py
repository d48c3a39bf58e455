"""G8: verl's ``hf_to_mcore_config_dpskv3`` for core_r0.8.0 + MindSpeed-LLM.

Upstream builds an ``MLATransformerConfig`` for Megatron >= 0.12. On this stack the DeepSeek-V3 layers are
MindSpeed-LLM's, configured from Megatron's global arguments (filled by our ``initialize_megatron`` from the
HF config and the verl config, vendor item D1), so the transformer config is the one MindSpeed-LLM itself
would build: ``core_transformer_config_from_args(get_args())``. Two things are added here:

- the HF config is checked against those arguments (a model config and a checkpoint layout that disagree
  would otherwise build a model of another shape and fail later, far from the cause);
- ``override_transformer_config`` from the verl config is honoured (the vendor's converter had no
  ``**kwargs`` and crashed on any override); every key must be a field of the config, else one error
  names it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

# (HF config attribute, Megatron argument) pairs that must agree for the built model to be the HF model.
HF_ARG_PAIRS: tuple[tuple[str, str], ...] = (
    ("num_hidden_layers", "num_layers"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("intermediate_size", "ffn_hidden_size"),
    ("moe_intermediate_size", "moe_intermediate_size"),
    ("n_routed_experts", "num_experts"),
    ("num_experts_per_tok", "moe_router_topk"),
    ("first_k_dense_replace", "first_k_dense_replace"),
    ("q_lora_rank", "q_lora_rank"),
    ("kv_lora_rank", "kv_lora_rank"),
    ("qk_nope_head_dim", "qk_nope_head_dim"),
    ("qk_rope_head_dim", "qk_rope_head_dim"),
    ("v_head_dim", "v_head_dim"),
    ("rms_norm_eps", "norm_epsilon"),
)


class ConfigMismatchError(ValueError):
    """The HF model config and the Megatron arguments describe different models."""


class UnknownOverrideError(KeyError):
    """An ``override_transformer_config`` key that the transformer config does not have."""


def hf_arg_mismatches(hf_config: Any, args: Any) -> list[str]:
    """Lines naming each HF/Megatron pair that differs (pairs absent on either side are not compared)."""
    out = []
    for hf_key, arg_key in HF_ARG_PAIRS:
        hf_val = getattr(hf_config, hf_key, None)
        arg_val = getattr(args, arg_key, None)
        if hf_val is None or arg_val is None:
            continue
        same = (
            abs(float(hf_val) - float(arg_val)) <= 1e-12 * max(1.0, abs(float(hf_val)))
            if isinstance(hf_val, float) or isinstance(arg_val, float)
            else hf_val == arg_val
        )
        if not same:
            out.append(f"model config {hf_key}={hf_val!r} but Megatron argument {arg_key}={arg_val!r}")
    return out


def apply_overrides(config: Any, overrides: Mapping[str, Any], where: str) -> Any:
    """Set each override on the dataclass ``config``; an unknown key is an error naming ``where.key``."""
    fields = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(k for k in overrides if k not in fields)
    if unknown:
        raise UnknownOverrideError(
            f"{where}.{unknown[0]} is not a field of {type(config).__name__}"
            + (f" (also unknown: {', '.join(unknown[1:])})" if len(unknown) > 1 else "")
        )
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


def hf_to_mcore_config_dpskv3(hf_config: Any, dtype: torch.dtype, **override_transformer_config: Any) -> Any:
    """The transformer config MindSpeed-LLM builds from the global arguments, for ``dtype``."""
    # deferred: a patch applies while upstream is still importing; Megatron is read at call time
    from megatron.training import get_args
    from megatron.training.arguments import core_transformer_config_from_args

    args = get_args()
    problems = hf_arg_mismatches(hf_config, args)
    if problems:
        raise ConfigMismatchError("the HF model config and the Megatron arguments disagree: " + "; ".join(problems))
    if getattr(hf_config, "num_nextn_predict_layers", 0):
        raise ConfigMismatchError(
            f"model config num_nextn_predict_layers={hf_config.num_nextn_predict_layers}: multi-token prediction "
            "is not trained on this stack; set it to 0 (verl_patches/scripts/make_config.py does)"
        )
    config = core_transformer_config_from_args(args)
    # verl trains in the dtype it asks for; MindSpeed-LLM's arguments may carry another default
    config.params_dtype = dtype
    config.pipeline_dtype = dtype
    config.bf16 = dtype is torch.bfloat16
    config.fp16 = dtype is torch.float16
    # verl feeds micro-batches of varying sequence length through the pipeline
    config.variable_seq_lengths = True
    return apply_overrides(config, override_transformer_config, "override_transformer_config")
