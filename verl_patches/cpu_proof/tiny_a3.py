"""The tiny local run on the A3 path: which assets it needs, derived from the composed config (pure), and
building them (thin).

On the A3 path (``actor.strategy=megatron``) the actor and the reference load our converter's Megatron
checkpoint of the tiny HF model in the run's own layout (TP/PP/EP, uneven layer list, grouped GEMM,
TP-extend-EP as the A3 job), and the rollout receives the actor's weights through the weight sync. The
model there routes as DeepSeek-V3 does on A3: 256 routed experts in 8 groups, the top 8 of the 4 best
groups, chosen on sigmoid scores plus a score-correction bias, so that vllm-ascend calls
`npu_moe_gating_top_k` (only for 256 experts) and MindSpeed-LLM's group-limited router trains it; small
experts keep it cheap. The bias makes nearly every biased score negative, where a 0.0 group mask (HF's)
would choose experts of unselected groups: every reference routes with DeepSeek's -inf mask (the declared
transformers patch). Its vocabulary is padded for the TP and EP splits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_patches.base.config_access import get
from verl_patches.base.job_layout import job_layout
from verl_patches.base.overlay_settings import OverlaySettings, overlay_settings
from verl_patches.cpu_proof.tiny_assets import TinyAssets, TinySpec, check_learnable_split, prepare, prepare_megatron
from verl_patches.reward.extract import FORMAT_RULE_KEY, FormatRule, parse_format_rule
from verl_patches.weights.config import official_config
from verl_patches.weights.layout import ParallelLayout

# DeepSeek-V3's router, every key at the official config's value (256 routed experts, n_group 8, topk_group 4,
# 8 per token): vllm-ascend routes through the fused npu_moe_gating_top_k only at exactly 256 experts
ROUTER_KEYS = ("n_routed_experts", "n_group", "topk_group", "num_experts_per_tok")
MEGATRON_MODEL_OVERRIDES: dict[str, Any] = {
    **{key: official_config()[key] for key in ROUTER_KEYS},
    # a quarter of the tiny default's expert width, with 8 experts per token instead of 2: a token's routed
    # experts compute what they did with 8 experts in all (8 x 8 = 2 x 32 wide); the shared expert keeps its width
    "moe_intermediate_size": 8,
    "n_shared_experts": 4,
    # A3's max_model_len (1024 + 3072): the rollout's chunked-prefill budget (3072) stays below it as on A3, and
    # an engine's 128 prompts (~40 tokens each) prefill in two steps, so decode steps make most of the tokens
    "max_position_embeddings": 4096,
}
# YaRN as DeepSeek-V3 (factor 40 over 4096), scaled to the tiny context: factor 4 over 1024
ROPE_ORIGINAL_MAX_POSITIONS = 1024
ROPE_FACTOR = 4.0
# Each MoE layer's score-correction bias: N(-1, 0.05^2). The offset moves every biased score below zero (a
# sigmoid is below 1) without changing DeepSeek's choice (a shift common to all experts); the spread does
# change it. MindSpeed-LLM updates the bias in training (moe_router_bias_update_rate), the weight sync carries it
ROUTER_BIAS_MEAN = -1.0
ROUTER_BIAS_STD = 0.05
VOCAB_MULTIPLE = 8
MCORE_DIR = "mcore"


def is_megatron(cfg: Any) -> bool:
    return get(cfg, "actor_rollout_ref.actor.strategy") == "megatron"


def _tiny(o: OverlaySettings, name: str) -> Any:
    """A tiny-run setting the tiny configs set; ValueError naming the key where a config does not."""
    value = getattr(o, name)
    if value is None:
        raise ValueError(f"tiny profile: overlay.{name} is not set")
    return value


def tiny_spec(cfg: Any) -> TinySpec:
    """The asset spec for this config (pure)."""
    o = overlay_settings(cfg)
    # a fifth of the distinct problems held out, each once (tiny_assets: what validation can measure); the base
    # model shows its working in think tags where the reward grades the strict R1-Zero format
    spec = TinySpec(
        seed=_tiny(o, "tiny_seed"),
        max_operand=_tiny(o, "tiny_max_operand"),
        train_ratio=0.8,
        unique_held_out=True,
        base_steps=o.tiny_base_steps,
        worked_answer=parse_format_rule(get(cfg, FORMAT_RULE_KEY, FormatRule.STRICT.value)) is FormatRule.STRICT,
    )
    if not is_megatron(cfg):
        return spec

    rope = dict(
        official_config()["rope_scaling"],
        original_max_position_embeddings=ROPE_ORIGINAL_MAX_POSITIONS,
        factor=ROPE_FACTOR,
    )
    overrides = dict(MEGATRON_MODEL_OVERRIDES, rope_scaling=rope)
    return TinySpec(
        seed=spec.seed,
        max_operand=spec.max_operand,
        train_ratio=spec.train_ratio,
        unique_held_out=spec.unique_held_out,
        base_steps=spec.base_steps,
        worked_answer=spec.worked_answer,
        vocab_multiple=VOCAB_MULTIPLE,
        model_overrides=tuple(sorted(overrides.items())),
        router_bias_mean=ROUTER_BIAS_MEAN,
        router_bias_std=ROUTER_BIAS_STD,
    )


def megatron_layout(cfg: Any) -> Any:
    """The actor's Megatron layout as our converter writes it (pure)."""

    m = "actor_rollout_ref.actor.megatron"
    layers = get(cfg, f"{m}.pipeline_parallel_num_layer_list")
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
        if get(cfg, f"{m}.{key}") != get(cfg, f"actor_rollout_ref.ref.megatron.{key}"):
            raise ValueError(
                f"tiny profile: actor_rollout_ref.ref.megatron.{key} must equal {m}.{key} "
                "(the reference loads the actor's checkpoint)"
            )
    training = job_layout(cfg).training
    return ParallelLayout(
        tp=training.tp,
        pp=training.pp,
        ep=training.ep,
        num_layer_list=tuple(int(n) for n in layers) if layers else None,
        moe_grouped_gemm=True,
        moe_tp_extend_ep=True,
    )


def assets_dir(cfg: Any) -> Path:
    return Path(_tiny(overlay_settings(cfg), "tiny_assets_dir"))


def checkpoint_dir(cfg: Any) -> Path:
    return assets_dir(cfg) / MCORE_DIR


def prepare_for(cfg: Any, progress: bool = True) -> TinyAssets:
    """Build (or reuse) everything the resolved tiny config reads: data, tokenizer, model, and on the A3
    path the Megatron checkpoint at `actor.megatron.dist_checkpointing_path`."""
    layout = None
    if is_megatron(cfg):  # every check before anything is built
        for role in ("actor", "ref"):
            target = get(cfg, f"actor_rollout_ref.{role}.megatron.dist_checkpointing_path")
            if target is None or Path(target) != checkpoint_dir(cfg):
                raise ValueError(
                    f"tiny profile: actor_rollout_ref.{role}.megatron.dist_checkpointing_path must be "
                    f"{checkpoint_dir(cfg)} (built here), found {target!r}"
                )
        layout = megatron_layout(cfg)
    spec = tiny_spec(cfg)
    assets = prepare(assets_dir(cfg), spec, progress=progress)
    check_learnable_split(assets, spec)  # validation must be able to rise
    if layout is not None:
        prepare_megatron(assets, checkpoint_dir(cfg), layout, progress=progress)
    return assets
