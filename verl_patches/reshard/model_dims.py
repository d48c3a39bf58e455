"""DeepSeek-V3 dimensions read from a Hugging Face ``config.json`` dict, and the per-stage parameter list
the reshard cost model and tests use.

The parameter list is the MindSpeed-LLM/Megatron layout of a DeepSeek-V3 decoder as this package sees it
*after* each stage's TP gather (full shapes), grouped-GEMM routed experts excepted (they stay as each
rank's shard and take the expert reshard). Names follow Megatron's ``decoder.layers.<local>.…`` scheme;
the weight converter in ``verl_patches/weights`` owns the exact checkpoint names, and nothing here depends
on a name beyond its ``decoder.layers.<i>.`` prefix and its shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from verl_patches.reshard.errors import InvalidLayoutError
from verl_patches.reshard.pp_plan import ParamSpec, dtype_bytes, validate_layer_list

_REQUIRED = ("hidden_size", "moe_intermediate_size", "n_routed_experts", "num_hidden_layers", "first_k_dense_replace")


@dataclass(frozen=True)
class ModelDims:
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

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any]) -> "ModelDims":
        """Read the dimensions from a ``config.json`` dict; a missing key is named in the error."""
        missing = [k for k in _REQUIRED if k not in config]
        if missing:
            raise InvalidLayoutError("config_keys", f"config.json lacks {missing}")
        dtype = str(config.get("torch_dtype", "bfloat16"))
        dtype_bytes(dtype)
        return cls(
            hidden=int(config["hidden_size"]),
            moe_ffn=int(config["moe_intermediate_size"]),
            num_experts=int(config["n_routed_experts"]),
            num_layers=int(config["num_hidden_layers"]),
            first_k_dense=int(config["first_k_dense_replace"]),
            dtype=dtype,
            dense_ffn=int(config.get("intermediate_size", 0)),
            num_heads=int(config.get("num_attention_heads", 0)),
            q_lora_rank=config.get("q_lora_rank"),
            kv_lora_rank=int(config.get("kv_lora_rank", 0)),
            qk_nope_head_dim=int(config.get("qk_nope_head_dim", 0)),
            qk_rope_head_dim=int(config.get("qk_rope_head_dim", 0)),
            v_head_dim=int(config.get("v_head_dim", 0)),
            n_shared_experts=int(config.get("n_shared_experts", 0) or 0),
            vocab_size=int(config.get("vocab_size", 0)),
        )

    @property
    def dtype_bytes(self) -> int:
        return dtype_bytes(self.dtype)

    @property
    def moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense

    def is_dense(self, layer: int) -> bool:
        return layer < self.first_k_dense


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
    # The keys of DeepSeek-V3's published config.json that the reshard cost model reads.
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
    "torch_dtype": "bfloat16",
}
PRODUCTION_LAYER_LIST = [7, 7, 8, 8, 8, 8, 8, 7]
