"""D2: the MindSpeed-LLM argument set our translation may produce: a whitelist with defaults.

An unknown key is an error naming it (a typo in a profile must not silently become a no-op flag);
'-' in keys is read as '_'.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# name -> default (None / False: not rendered on the command line)
KNOWN_ARGS: dict[str, Any] = {
    # base training
    "seed": 1234,
    "bf16": False,
    "fp16": False,
    "global_batch_size": None,
    "micro_batch_size": None,
    "seq_length": None,
    "variable_seq_lengths": False,
    "attention_dropout": 0.0,
    "hidden_dropout": 0.0,
    "init_method_std": 0.01,
    "lr": None,
    "lr_decay_style": "constant",
    "min_lr": 0.0,
    "weight_decay": 0.0,
    "lr_warmup_iters": 0,
    "lr_warmup_fraction": None,
    "clip_grad": 1.0,
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "initial_loss_scale": 4096,
    "moe_router_bias_update_rate": 0.001,
    "moe_aux_loss_coeff": 0.0,
    "finetune": False,
    "train_iters": None,
    "save_interval": None,
    "no_shared_storage": False,
    # parallel
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "expert_model_parallel_size": 1,
    "context_parallel_size": 1,
    "sequence_parallel": False,
    "use_distributed_optimizer": False,
    "num_layer_list": None,
    "use_cp_send_recv_overlap": False,
    "context_parallel_algo": None,
    "use_fused_ring_attention_update": False,
    "cp_window_size": None,
    "distributed_backend": "nccl",
    "num_layers_per_virtual_pipeline_stage": None,
    # optimisations
    "shape_order": None,
    "use_fused_rmsnorm": False,
    "use_flash_attn": False,
    "no_masked_softmax_fusion": False,
    "attention_softmax_in_fp32": False,
    "no_gradient_accumulation_fusion": False,
    "use_fused_swiglu": False,
    "use_fused_rotary_pos_emb": False,
    "overlap_grad_reduce": False,
    "overlap_param_gather": False,
    "use_rotary_position_embeddings": False,
    "use_fused_mlp": False,
    "recompute_granularity": None,
    "recompute_method": None,
    "recompute_num_layers": None,
    "swap_optimizer": False,
    # model
    "use_mcore_models": False,
    "spec": None,
    "tokenizer_type": None,
    "tokenizer_name_or_path": None,
    "num_layers": None,
    "hidden_size": None,
    "ffn_hidden_size": None,
    "num_attention_heads": None,
    "rotary_base": None,
    "max_position_embeddings": None,
    "make_vocab_size_divisible_by": 1,
    "padded_vocab_size": None,
    "untie_embeddings_and_output_weights": False,
    "add_qkv_bias": False,
    "disable_bias_linear": False,
    "num_query_groups": None,
    "group_query_attention": False,
    "position_embedding_type": None,
    "normalization": None,
    "norm_epsilon": None,
    "swiglu": False,
    "rope_scaling_beta_fast": None,
    "rope_scaling_beta_slow": None,
    "rope_scaling_mscale": None,
    "rope_scaling_mscale_all_dim": None,
    "rope_scaling_original_max_position_embeddings": None,
    "rope_scaling_type": None,
    "rope_scaling_factor": None,
    # DeepSeek-V3
    "moe_router_topk": None,
    "multi_head_latent_attention": False,
    "q_lora_rank": None,
    "kv_lora_rank": None,
    "qk_rope_head_dim": None,
    "qk_nope_head_dim": None,
    "v_head_dim": None,
    "qk_layernorm": False,
    "first_k_dense_replace": None,
    "moe_intermediate_size": None,
    "moe_layer_freq": None,
    "num_experts": None,
    "n_shared_experts": None,
    "moe_router_load_balancing_type": None,
    "topk_group": None,
    "n_group": None,
    "routed_scaling_factor": None,
    "moe_router_score_function": None,
    "seq_aux": False,
    "moe_token_dispatcher_type": None,
    "fix_router": False,
    "moe_alltoall_overlap_comm": False,
    "moe_grouped_gemm": False,
    "moe_router_enable_expert_bias": False,
    "moe_tp_extend_ep": False,
    "moe_permutation_async_comm": False,
    "gemm_gradient_accumulation_fusion": False,
    "use_fused_moe_token_permute_and_unpermute": False,
    "no_load_optim": False,
    "no_load_rng": False,
    "norm_topk_prob": False,
}


def normalize_key(key: str) -> str:
    return key.replace("-", "_")


class MegatronConfig(Mapping):
    """The MindSpeed-LLM argument values of one job: every known argument, defaulted, none unknown."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self._values: dict[str, Any] = dict(KNOWN_ARGS)
        if values:
            self.update(values)

    def update(self, values: Mapping[str, Any]) -> None:
        unknown = sorted(k for k in values if normalize_key(k) not in KNOWN_ARGS)
        if unknown:
            raise ValueError(
                f"MegatronConfig: unknown argument(s) {unknown}; known arguments are listed in "
                f"verl_patches/train_engine/megatron_config.py (KNOWN_ARGS)"
            )
        for key, value in values.items():
            self._values[normalize_key(key)] = value

    def __getitem__(self, key: str) -> Any:
        return self._values[normalize_key(key)]

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[normalize_key(key)]
        except KeyError:
            raise AttributeError(key) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)
