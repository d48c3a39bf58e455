"""DeepSeek-V3's dimensions, read from a Hugging Face ``config.json`` dict: `ModelDims`, the one description
of the model that the reshard planners and cost model, the launch's memory, MC2 and checkpoint estimates and
the MLA config shim (`patches/verl/models/mla_config.py`) all use; and the per-stage parameter list the reshard
cost model and tests use.

The parameter list is the MindSpeed-LLM/Megatron layout of a DeepSeek-V3 decoder as this package sees it
*after* each stage's TP gather (full shapes), grouped-GEMM routed experts excepted (they stay as each
rank's shard and take the expert reshard). Names follow Megatron's ``decoder.layers.<local>.…`` scheme;
the weight converter in ``verl_patches/weights`` owns the exact checkpoint names, and nothing here depends
on a name beyond its ``decoder.layers.<i>.`` prefix and its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.pp_plan import ParamSpec, dtype_bytes, validate_layer_list

# config.json key -> ModelDims field; `from_hf_config` needs every key but the optional ones
HF_KEYS: dict[str, str] = {
    "hidden_size": "hidden",
    "moe_intermediate_size": "moe_ffn",
    "n_routed_experts": "num_experts",
    "num_hidden_layers": "num_layers",
    "first_k_dense_replace": "first_k_dense",
    "intermediate_size": "dense_ffn",
    "num_attention_heads": "num_heads",
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_nope_head_dim",
    "qk_rope_head_dim": "qk_rope_head_dim",
    "v_head_dim": "v_head_dim",
    "n_shared_experts": "n_shared_experts",
    "vocab_size": "vocab_size",
    "num_experts_per_tok": "topk",
}
OPTIONAL_HF_KEYS = ("q_lora_rank", "n_shared_experts")  # absent or null: no query LoRA, no shared expert
KV_CACHE_DTYPE_BYTES = 2  # the rollout's MLA latent cache is BF16 (vLLM's kv_cache_dtype "auto" on a BF16 model)


@dataclass(frozen=True)
class ModelDims:
    """The dimensions of a DeepSeek-V3-shaped model (MLA attention, ``first_k_dense`` dense layers, then MoE
    layers of ``num_experts`` routed experts, top-``topk``, and ``n_shared_experts`` shared ones)."""

    hidden: int
    moe_ffn: int
    num_experts: int
    num_layers: int
    first_k_dense: int
    dtype: str = "bfloat16"
    dense_ffn: int = 0
    num_heads: int = 0
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    n_shared_experts: int = 0
    vocab_size: int = 0
    topk: int = 0

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> ModelDims:
        """Read the dimensions from a ``config.json`` dict; the missing keys are named in the error."""
        missing = [k for k in HF_KEYS if k not in config and k not in OPTIONAL_HF_KEYS]
        if missing:
            raise InvalidLayoutError("config_keys", f"config.json lacks {missing}")
        dtype = str(config.get("torch_dtype", "bfloat16"))
        dtype_bytes(dtype)
        sizes = {field: int(config.get(key) or 0) for key, field in HF_KEYS.items()}
        q_lora_rank = sizes.pop("q_lora_rank") or None  # 0 or absent: queries projected without a LoRA
        return cls(dtype=dtype, q_lora_rank=q_lora_rank, **sizes)

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense

    def is_dense(self, layer: int) -> bool:
        return layer < self.first_k_dense

    def is_moe(self, layer: int) -> bool:
        return not self.is_dense(layer)

    @property
    def shared_ffn(self) -> int:
        """The shared experts' FFN width, as one dense MLP (Megatron's moe_shared_expert_intermediate_size)."""
        return self.n_shared_experts * self.moe_ffn

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """The rollout's MLA latent cache per token: (kv_lora_rank + qk_rope_head_dim) x layers, BF16."""
        return (self.kv_lora_rank + self.qk_rope_head_dim) * self.num_layers * KV_CACHE_DTYPE_BYTES


def deepseek_v3_stage_params(dims: ModelDims, num_layer_list: list[int], stage: int) -> list[ParamSpec]:
    """Full-shape (TP-gathered) non-expert parameters of one pipeline stage, in module order.

    Routed experts appear too (``mlp.experts.weight1/2`` with the stage-independent full shape) so that
    planners see and exclude them exactly as they would on a real model.
    """
    validate_layer_list(num_layer_list, len(num_layer_list), dims.num_layers)
    h, dt = dims.hidden, dims.dtype
    q_head = dims.qk_nope_head_dim + dims.qk_rope_head_dim
    first = sum(num_layer_list[:stage])
    out: list[ParamSpec] = []
    if stage == 0:
        out.append(ParamSpec("embedding.word_embeddings.weight", (dims.vocab_size, h), dt))
    for local in range(num_layer_list[stage]):
        p = f"decoder.layers.{local}."
        qkv_rows = (dims.q_lora_rank or 0) + dims.kv_lora_rank + dims.qk_rope_head_dim
        out += [
            ParamSpec(p + "input_layernorm.weight", (h,), dt),
            ParamSpec(p + "self_attention.linear_qkv.weight", (qkv_rows, h), dt),
        ]
        if dims.q_lora_rank:
            out += [
                ParamSpec(p + "self_attention.q_layernorm.weight", (dims.q_lora_rank,), dt),
                ParamSpec(p + "self_attention.linear_qb.weight", (dims.num_heads * q_head, dims.q_lora_rank), dt),
            ]
        out += [
            ParamSpec(p + "self_attention.k_layernorm.weight", (dims.kv_lora_rank,), dt),
            ParamSpec(
                p + "self_attention.linear_kvb.weight",
                (dims.num_heads * (dims.qk_nope_head_dim + dims.v_head_dim), dims.kv_lora_rank),
                dt,
            ),
            ParamSpec(p + "self_attention.linear_proj.weight", (h, dims.num_heads * dims.v_head_dim), dt),
            ParamSpec(p + "pre_mlp_layernorm.weight", (h,), dt),
        ]
        if dims.is_dense(first + local):
            out += [
                ParamSpec(p + "mlp.linear_fc1.weight", (2 * dims.dense_ffn, h), dt),
                ParamSpec(p + "mlp.linear_fc2.weight", (h, dims.dense_ffn), dt),
            ]
        else:
            shared = dims.n_shared_experts * dims.moe_ffn
            out += [
                ParamSpec(p + "mlp.router.weight", (dims.num_experts, h), dt),
                ParamSpec(p + "mlp.router.expert_bias", (dims.num_experts,), "float32"),
                ParamSpec(p + "mlp.shared_experts.linear_fc1.weight", (2 * shared, h), dt),
                ParamSpec(p + "mlp.shared_experts.linear_fc2.weight", (h, shared), dt),
                ParamSpec(p + "mlp.experts.weight1", (h, dims.num_experts * 2 * dims.moe_ffn), dt),
                ParamSpec(p + "mlp.experts.weight2", (dims.num_experts * dims.moe_ffn, h), dt),
            ]
    if stage == len(num_layer_list) - 1:
        out += [
            ParamSpec("decoder.final_layernorm.weight", (h,), dt),
            ParamSpec("output_layer.weight", (dims.vocab_size, h), dt),
        ]
    return out


DEEPSEEK_V3_CONFIG: dict[str, Any] = {
    # The dimension keys (`HF_KEYS`) of DeepSeek-V3's published config.json, and its dtype.
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 129280,
    "num_experts_per_tok": 8,
    "torch_dtype": "bfloat16",
}
DEEPSEEK_V3 = ModelDims.from_hf_config(DEEPSEEK_V3_CONFIG)
PRODUCTION_LAYER_LIST = [7, 7, 8, 8, 8, 8, 8, 7]
