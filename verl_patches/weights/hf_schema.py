"""The tensors of a DeepSeek-V3 Hugging Face checkpoint (names, shapes, dtypes), derived from config.json.

Used to check a checkpoint before converting it, to plan output shards, to estimate the memory and disk a
conversion needs without reading any weight, and to generate synthetic checkpoints.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from verl_patches.weights.st_writer import TensorSpec

# Linear weights that DeepSeek-V3 ships as block-quantised FP8 (the router, norms, embedding and head are not).
_FP8_RE = re.compile(
    r"^model\.layers\.\d+\.(self_attn\.(q_a_proj|q_b_proj|kv_a_proj_with_mqa|kv_b_proj|o_proj)"
    r"|mlp\.(shared_experts\.|experts\.\d+\.)?(gate_proj|up_proj|down_proj))\.weight$"
)


def is_fp8_quantized(name: str) -> bool:
    return bool(_FP8_RE.match(name))


def is_moe_layer(cfg: Mapping[str, Any], layer: int) -> bool:
    return layer >= cfg["first_k_dense_replace"]


def hf_layer_shapes(cfg: Mapping[str, Any], layer: int) -> dict[str, tuple[int, ...]]:
    """``{name: shape}`` of decoder layer ``layer`` in a stable order (attention, then MLP)."""
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    nope, rope, v = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    ql, kvl = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    p = f"model.layers.{layer}."
    s: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (h,),
        p + "self_attn.q_a_proj.weight": (ql, h),
        p + "self_attn.q_a_layernorm.weight": (ql,),
        p + "self_attn.q_b_proj.weight": (heads * (nope + rope), ql),
        p + "self_attn.kv_a_proj_with_mqa.weight": (kvl + rope, h),
        p + "self_attn.kv_a_layernorm.weight": (kvl,),
        p + "self_attn.kv_b_proj.weight": (heads * (nope + v), kvl),
        p + "self_attn.o_proj.weight": (h, heads * v),
        p + "post_attention_layernorm.weight": (h,),
    }
    if not is_moe_layer(cfg, layer):
        i = cfg["intermediate_size"]
        s[p + "mlp.gate_proj.weight"] = (i, h)
        s[p + "mlp.up_proj.weight"] = (i, h)
        s[p + "mlp.down_proj.weight"] = (h, i)
        return s
    e, f = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
    fs = f * cfg["n_shared_experts"]
    s[p + "mlp.gate.weight"] = (e, h)
    s[p + "mlp.gate.e_score_correction_bias"] = (e,)
    s[p + "mlp.shared_experts.gate_proj.weight"] = (fs, h)
    s[p + "mlp.shared_experts.up_proj.weight"] = (fs, h)
    s[p + "mlp.shared_experts.down_proj.weight"] = (h, fs)
    for x in range(e):
        s[p + f"mlp.experts.{x}.gate_proj.weight"] = (f, h)
        s[p + f"mlp.experts.{x}.up_proj.weight"] = (f, h)
        s[p + f"mlp.experts.{x}.down_proj.weight"] = (h, f)
    return s


def hf_mtp_extra_shapes(cfg: Mapping[str, Any], layer: int) -> dict[str, tuple[int, ...]]:
    """The tensors an MTP layer has on top of a decoder layer (DeepSeek-V3's layer 61)."""
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    p = f"model.layers.{layer}."
    return {
        p + "embed_tokens.weight": (vocab, h),
        p + "enorm.weight": (h,),
        p + "hnorm.weight": (h,),
        p + "eh_proj.weight": (h, 2 * h),
        p + "shared_head.norm.weight": (h,),
        p + "shared_head.head.weight": (vocab, h),
    }


def hf_dtype(name: str, dtype: torch.dtype = torch.bfloat16) -> torch.dtype:
    """DeepSeek-V3 keeps the router's score-correction bias in float32."""
    return torch.float32 if name.endswith("e_score_correction_bias") else dtype


def hf_tensor_specs(
    cfg: Mapping[str, Any], dtype: torch.dtype = torch.bfloat16, num_mtp_layers: int = 0
) -> list[TensorSpec]:
    """Every tensor of the checkpoint in a stable order: embedding, layers, MTP layers, norm, head."""
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg["vocab_size"], cfg["hidden_size"])}
    n = cfg["num_hidden_layers"]
    for layer in range(n):
        shapes.update(hf_layer_shapes(cfg, layer))
    for layer in range(n, n + num_mtp_layers):
        shapes.update(hf_layer_shapes(cfg, layer))
        shapes.update(hf_mtp_extra_shapes(cfg, layer))
    shapes["model.norm.weight"] = (cfg["hidden_size"],)
    shapes["lm_head.weight"] = (cfg["vocab_size"], cfg["hidden_size"])
    return [TensorSpec(k, hf_dtype(k, dtype), v) for k, v in shapes.items()]
