"""D1: verl's trainer config + the model's HF config.json -> MindSpeed-LLM arguments (pure).

The A3 job runs MindSpeed-LLM's full argument and patch path, so every MindSpeed feature the profile
wants is named here; verl's own Megatron init would turn none of them on. Keys our profiles add under
`actor_rollout_ref.actor.megatron` beyond verl's config (`pipeline_parallel_num_layer_list`,
`swap_optimizer`, `fix_router`) are consumed here: see CONSUMED_PROFILE_KEYS.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_patches.train_engine.megatron_config import MegatronConfig

ACTOR = "actor_rollout_ref.actor"
CONSUMED_PROFILE_KEYS = (
    f"{ACTOR}.megatron.pipeline_parallel_num_layer_list",
    f"{ACTOR}.megatron.swap_optimizer",
    f"{ACTOR}.megatron.fix_router",
)
_MISSING = object()


class TranslationError(ValueError):
    """A config value that cannot become a valid MindSpeed-LLM argument; the message names the key."""


def _get(config: Any, dotted: str, default: Any = _MISSING) -> Any:
    """config[a][b]... for "a.b...", or default (a missing key, or a None on the way)."""
    node = config
    for part in dotted.split("."):
        try:
            node = node[part]
        except (KeyError, TypeError, AttributeError, IndexError):
            node = _MISSING
            break
        if node is None:
            break
    if node is _MISSING or node is None:
        if default is _MISSING:
            raise TranslationError(f"config key {dotted} is required")
        return default
    return node


def _hf(hf: Mapping[str, Any], key: str, default: Any = _MISSING) -> Any:
    if key in hf and hf[key] is not None:
        return hf[key]
    if default is _MISSING:
        raise TranslationError(f"HF config.json key {key!r} is required for DeepSeek-V3")
    return default


def _int(config: Any, dotted: str, default: Any = _MISSING, minimum: int | None = None) -> int:
    value = _get(config, dotted, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TranslationError(f"config key {dotted} must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise TranslationError(f"config key {dotted} must be >= {minimum}, got {value}")
    return value


def _bool(config: Any, dotted: str, default: bool = False) -> bool:
    value = _get(config, dotted, default)
    if not isinstance(value, bool):
        raise TranslationError(f"config key {dotted} must be true or false, got {value!r}")
    return value


def load_hf_config(model_path: str) -> dict:
    path = Path(model_path) / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TranslationError(f"actor_rollout_ref.model.path: {path} does not exist") from None
    except json.JSONDecodeError as e:
        raise TranslationError(f"{path}: not valid JSON at line {e.lineno}: {e.msg}") from None


def layer_list(config: Any, num_layers: int, pp: int) -> list[int] | None:
    """The validated uneven PP split, or None when the layers divide evenly and no list is given."""
    key = f"{ACTOR}.megatron.pipeline_parallel_num_layer_list"
    raw = _get(config, key, None)
    if raw is None:
        if num_layers % pp:
            raise TranslationError(
                f"{num_layers} layers do not divide over pipeline_model_parallel_size={pp}: "
                f"set {key} (one layer count per stage)"
            )
        return None
    if isinstance(raw, str):
        raw = [p for p in raw.strip("[]").replace(" ", "").split(",") if p]
    try:
        counts = [int(v) for v in raw]
    except (TypeError, ValueError):
        raise TranslationError(f"{key} must be a list of integers, got {raw!r}") from None
    if len(counts) != pp:
        raise TranslationError(f"{key} has {len(counts)} entries for pipeline_model_parallel_size={pp}")
    if any(c < 1 for c in counts):
        raise TranslationError(f"{key}={counts}: every stage needs at least one layer")
    if sum(counts) != num_layers:
        raise TranslationError(f"{key}={counts} sums to {sum(counts)}, the model has {num_layers} layers")
    return counts


ROLES = ("actor", "ref")
PARALLEL_KEYS = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "expert_model_parallel_size",
    "context_parallel_size",
)


def check_ref_layout(config: Any) -> None:
    """The reference shares the actor's process and parallel state (fused ActorRolloutRef worker): any
    parallel size it sets must equal the actor's."""
    for key in PARALLEL_KEYS:
        ref = _get(config, f"actor_rollout_ref.ref.megatron.{key}", None)
        actor = _get(config, f"{ACTOR}.megatron.{key}", 1)
        if ref is not None and ref != actor:
            raise TranslationError(
                f"actor_rollout_ref.ref.megatron.{key}={ref} differs from the actor's {actor}: "
                "actor and reference share one parallel state per process"
            )


def translate_verl_train_configs_to_megatron(
    config: Any, hf_config: Mapping[str, Any] | None = None, role: str = "actor"
) -> MegatronConfig:
    """The MindSpeed-LLM arguments for the actor (role="actor") or reference (role="ref") of a GRPO job
    on DeepSeek-V3. Both give the same MindSpeed feature flags; the reference's micro-batch is its
    log-prob micro-batch.

    config: verl's full trainer config (OmegaConf or nested mappings): `algorithm`, `data`,
      `actor_rollout_ref`, `trainer`. hf_config: the model's config.json as a dict (read from
      `actor_rollout_ref.model.path` when None).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    check_ref_layout(config)
    estimator = _get(config, "algorithm.adv_estimator")
    if estimator != "grpo":
        raise TranslationError(f"algorithm.adv_estimator={estimator!r}: the A3 train engine supports grpo only")
    hf = dict(hf_config) if hf_config is not None else load_hf_config(_get(config, "actor_rollout_ref.model.path"))
    mg = f"{ACTOR}.megatron"
    tp = _int(config, f"{mg}.tensor_model_parallel_size", 1, 1)
    pp = _int(config, f"{mg}.pipeline_model_parallel_size", 1, 1)
    ep = _int(config, f"{mg}.expert_model_parallel_size", 1, 1)
    cp = _int(config, f"{mg}.context_parallel_size", 1, 1)
    n = _int(config, "actor_rollout_ref.rollout.n", 1, 1)
    num_layers = int(_hf(hf, "num_hidden_layers"))
    heads = int(_hf(hf, "num_attention_heads"))
    kv_heads = int(_hf(hf, "num_key_value_heads", heads))
    if heads % kv_heads:
        raise TranslationError(
            f"HF config: num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}"
        )
    if tp > 1 and not _bool(config, f"{mg}.sequence_parallel", False):
        raise TranslationError(
            f"{mg}.sequence_parallel must be true with tensor_model_parallel_size={tp}: "
            "MindSpeed's TP-extend-EP MoE path (moe_tp_extend_ep) splits tokens by sequence"
        )
    warmup = _get(config, f"{ACTOR}.optim.lr_warmup_steps", -1)
    warmup = -1 if warmup is None else int(warmup)
    counts = layer_list(config, num_layers, pp)

    args: dict[str, Any] = {
        # base training
        "seed": _int(config, f"{mg}.seed", 42),
        "bf16": True,
        "global_batch_size": _int(config, "data.train_batch_size", minimum=1) * n,
        "micro_batch_size": (
            _int(config, f"{ACTOR}.ppo_micro_batch_size_per_gpu", 1, 1)
            if role == "actor"
            else _int(config, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 1, 1)
        ),
        "seq_length": _int(config, "data.max_prompt_length", minimum=1)
        + _int(config, "data.max_response_length", minimum=1),
        "variable_seq_lengths": True,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "init_method_std": 0.01,
        "lr": float(_get(config, f"{ACTOR}.optim.lr")),
        "lr_decay_style": "constant",
        "min_lr": 0.0,
        "weight_decay": float(_get(config, f"{ACTOR}.optim.weight_decay", 0.01)),
        "lr_warmup_iters": max(0, warmup),
        "lr_warmup_fraction": float(_get(config, f"{ACTOR}.optim.lr_warmup_steps_ratio", 0.0) or 0.0)
        if warmup < 0
        else None,
        "clip_grad": float(_get(config, f"{ACTOR}.optim.clip_grad", 1.0)),
        "adam_beta1": 0.9,
        "adam_beta2": 0.95,
        "initial_loss_scale": 4096,
        "moe_router_bias_update_rate": 0.001,
        "moe_aux_loss_coeff": float(_hf(hf, "aux_loss_alpha", 0.0)),
        "finetune": True,
        "train_iters": max(1, int(_get(config, "trainer.total_training_steps", 1) or 1)),
        "save_interval": None,
        "no_shared_storage": True,
        # parallel
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "context_parallel_size": cp,
        "sequence_parallel": tp > 1,
        "use_distributed_optimizer": _bool(config, f"{mg}.use_distributed_optimizer", True),
        "num_layer_list": ",".join(str(c) for c in counts) if counts else None,
        "distributed_backend": "nccl",
        # optimisations (MindSpeed features of the A3 profile)
        "shape_order": "BNSD",
        "use_fused_rmsnorm": True,
        "use_flash_attn": True,
        "no_masked_softmax_fusion": True,
        "attention_softmax_in_fp32": True,
        "no_gradient_accumulation_fusion": True,
        "use_fused_swiglu": True,
        "use_fused_rotary_pos_emb": True,
        "overlap_grad_reduce": True,
        "overlap_param_gather": True,
        "use_rotary_position_embeddings": True,
        # model
        "use_mcore_models": True,
        "spec": ["mindspeed_llm.tasks.models.spec.deepseek_spec", "layer_spec"],  # MLA, dense/MoE, shared experts
        "tokenizer_type": "PretrainedFromHF",
        "tokenizer_name_or_path": _get(config, "actor_rollout_ref.model.path", None),
        "num_layers": num_layers,
        "hidden_size": int(_hf(hf, "hidden_size")),
        "ffn_hidden_size": int(_hf(hf, "intermediate_size")),
        "num_attention_heads": heads,
        "rotary_base": int(_hf(hf, "rope_theta", 10000)),
        "max_position_embeddings": int(_hf(hf, "max_position_embeddings")),
        "make_vocab_size_divisible_by": 1,
        "padded_vocab_size": int(_hf(hf, "vocab_size")),
        "untie_embeddings_and_output_weights": not bool(hf.get("tie_word_embeddings", False)),
        "add_qkv_bias": False,
        "disable_bias_linear": True,
        # The group count (not the heads/kv_heads ratio the vendor passed): Megatron reads it only with GQA on.
        "num_query_groups": kv_heads,
        "group_query_attention": kv_heads < heads,
        "position_embedding_type": "rope",
        "normalization": "RMSNorm",
        "norm_epsilon": float(_hf(hf, "rms_norm_eps", 1e-6)),
        "swiglu": True,
        # DeepSeek-V3
        "moe_router_topk": int(_hf(hf, "num_experts_per_tok")),
        "multi_head_latent_attention": True,
        "q_lora_rank": hf.get("q_lora_rank"),
        "kv_lora_rank": int(_hf(hf, "kv_lora_rank")),
        "qk_rope_head_dim": int(_hf(hf, "qk_rope_head_dim")),
        "qk_nope_head_dim": int(_hf(hf, "qk_nope_head_dim")),
        "v_head_dim": int(_hf(hf, "v_head_dim")),
        "qk_layernorm": True,
        "first_k_dense_replace": int(_hf(hf, "first_k_dense_replace", 0)),
        "moe_intermediate_size": int(_hf(hf, "moe_intermediate_size")),
        "moe_layer_freq": int(_hf(hf, "moe_layer_freq", 1)),
        "num_experts": int(_hf(hf, "n_routed_experts")),
        "n_shared_experts": hf.get("n_shared_experts"),
        "moe_router_load_balancing_type": _hf(hf, "topk_method", "noaux_tc"),
        "topk_group": hf.get("topk_group"),
        "n_group": hf.get("n_group"),
        "routed_scaling_factor": hf.get("routed_scaling_factor"),
        "moe_router_score_function": _hf(hf, "scoring_func", "sigmoid"),
        "seq_aux": bool(hf.get("seq_aux", False)),
        "moe_token_dispatcher_type": "alltoall",
        "fix_router": _bool(config, f"{mg}.fix_router", False),
        "moe_alltoall_overlap_comm": True,
        "moe_grouped_gemm": True,
        "moe_router_enable_expert_bias": True,
        "moe_tp_extend_ep": True,
        "moe_permutation_async_comm": True,
        "gemm_gradient_accumulation_fusion": True,
        "use_fused_moe_token_permute_and_unpermute": True,
        "no_load_optim": True,
        "no_load_rng": True,
        "norm_topk_prob": bool(hf.get("norm_topk_prob", False)),
    }
    scaling = hf.get("rope_scaling") or {}
    head = int(_hf(hf, "hidden_size")) // heads
    if not scaling and int(_hf(hf, "qk_rope_head_dim")) != head:
        # MindSpeed-LLM sizes the rotary embedding from kv_channels (hidden_size / heads) and only its yarn path
        # recomputes it from qk_rope_head_dim: such a model would fail in the first forward pass
        raise TranslationError(
            f"HF config has no rope_scaling: MindSpeed-LLM would size RoPE as hidden_size / "
            f"num_attention_heads = {head}, not qk_rope_head_dim = {_hf(hf, 'qk_rope_head_dim')}; "
            f"give the checkpoint DeepSeek-V3's yarn rope_scaling (as make_config.py writes it)"
        )
    if scaling:
        kind = scaling.get("type", scaling.get("rope_type"))
        if kind != "yarn":
            raise TranslationError(f"HF config rope_scaling.type={kind!r}: DeepSeek-V3 uses yarn")
        args.update(
            {
                "rope_scaling_type": "yarn",
                "rope_scaling_beta_fast": int(scaling.get("beta_fast", 32)),
                "rope_scaling_beta_slow": int(scaling.get("beta_slow", 1)),
                "rope_scaling_mscale": float(scaling.get("mscale", 1.0)),
                "rope_scaling_mscale_all_dim": float(scaling.get("mscale_all_dim", 0.0)),
                "rope_scaling_original_max_position_embeddings": int(scaling["original_max_position_embeddings"]),
                "rope_scaling_factor": float(scaling["factor"]),
            }
        )
    if cp > 1:
        args.update(
            {
                "use_cp_send_recv_overlap": True,
                "context_parallel_algo": "megatron_cp_algo",
                "use_fused_ring_attention_update": True,
                "cp_window_size": 1,
            }
        )
    if _bool(config, "actor_rollout_ref.model.enable_gradient_checkpointing", False):
        kw = "actor_rollout_ref.model.gradient_checkpointing_kwargs"
        args.update(
            {
                "recompute_granularity": _get(config, f"{kw}.activations_checkpoint_granularity", "full"),
                "recompute_method": _get(config, f"{kw}.activations_checkpoint_method", "block"),
                "recompute_num_layers": _int(config, f"{kw}.activations_checkpoint_num_layers", 1, 1),
            }
        )
    if _bool(config, f"{mg}.swap_optimizer", False):
        if _bool(config, f"{mg}.optimizer_offload", False):
            raise TranslationError(
                f"{mg}.swap_optimizer and {mg}.optimizer_offload exclude each other: "
                "the swap already keeps optimizer state on the host between steps"
            )
        args["swap_optimizer"] = True
    return MegatronConfig(args)
