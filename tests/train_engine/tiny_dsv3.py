"""A tiny DeepSeek-V3-shaped HF config and verl trainer config for the train-engine tests."""

from __future__ import annotations

import copy

TINY_HF_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "n_shared_experts": 1,
    "n_routed_experts": 4,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "v_head_dim": 16,
    "qk_nope_head_dim": 16,
    "topk_method": "noaux_tc",
    "n_group": 1,
    "topk_group": 1,
    "num_experts_per_tok": 2,
    "moe_layer_freq": 1,
    "first_k_dense_replace": 1,
    "norm_topk_prob": True,
    "scoring_func": "sigmoid",
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000,
    "tie_word_embeddings": False,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 4.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 64,
        "type": "yarn",
    },
    "torch_dtype": "float32",
}

# The vendor's fused-kernel and MoE switches: the Megatron arguments D1 turns on for the A3 job.
VENDOR_SWITCHES = (
    "use_fused_rmsnorm",
    "use_flash_attn",
    "use_fused_swiglu",
    "use_fused_rotary_pos_emb",
    "moe_grouped_gemm",
    "moe_tp_extend_ep",
    "moe_alltoall_overlap_comm",
    "moe_permutation_async_comm",
    "gemm_gradient_accumulation_fusion",
    "use_fused_moe_token_permute_and_unpermute",
    "moe_router_enable_expert_bias",
)

TINY_VERL_CONFIG = {
    "algorithm": {"adv_estimator": "grpo"},
    "data": {"train_batch_size": 4, "max_prompt_length": 16, "max_response_length": 16},
    "trainer": {"total_training_steps": 2},
    "actor_rollout_ref": {
        "model": {"path": "/nonexistent/tiny", "enable_gradient_checkpointing": False},
        "rollout": {"n": 2},
        "actor": {
            "ppo_micro_batch_size_per_gpu": 2,
            "optim": {
                "lr": 1e-3,
                "clip_grad": 1.0,
                "weight_decay": 0.0,
                "lr_warmup_steps": -1,
                "lr_warmup_steps_ratio": 0.0,
            },
            "megatron": {
                "tensor_model_parallel_size": 1,
                "pipeline_model_parallel_size": 1,
                "expert_model_parallel_size": 1,
                "context_parallel_size": 1,
                "sequence_parallel": False,
                "use_distributed_optimizer": True,
                "seed": 42,
                "swap_optimizer": False,
                "optimizer_offload": False,
                "fix_router": False,
            },
        },
    },
}


def verl_config(**megatron: object) -> dict:
    cfg = copy.deepcopy(TINY_VERL_CONFIG)
    cfg["actor_rollout_ref"]["actor"]["megatron"].update(megatron)
    return cfg
