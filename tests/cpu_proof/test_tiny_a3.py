"""The tiny run's A3-path assets, derived from the composed config: spec, Megatron layout, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.cpu_proof.tiny_a3 import (
    MEGATRON_MODEL_OVERRIDES,
    ROPE_FACTOR,
    ROPE_ORIGINAL_MAX_POSITIONS,
    VOCAB_MULTIPLE,
    checkpoint_dir,
    megatron_layout,
    prepare_for,
    tiny_spec,
)
from verl_patches.trainer.config_compose import compose_config, resolved


def cfg(name: str = "ppo_tiny_local", *overrides: str, assets: Path = Path("/tmp/none")):
    return resolved(compose_config(name, [f"overlay.tiny_assets_dir={assets}", *overrides]))


def test_a3_path_spec_and_layout() -> None:
    c = cfg()
    spec = tiny_spec(c)
    assert spec.vocab_multiple == VOCAB_MULTIPLE and spec.seed == 1 and spec.max_operand == 2
    overrides = dict(spec.model_overrides)
    assert {k: overrides[k] for k in MEGATRON_MODEL_OVERRIDES} == MEGATRON_MODEL_OVERRIDES
    rope = overrides["rope_scaling"]
    assert (rope["original_max_position_embeddings"], rope["factor"]) == (ROPE_ORIGINAL_MAX_POSITIONS, ROPE_FACTOR)
    # the rollout's max_model_len is the model's context, A3's 4096, and YaRN reaches it
    assert overrides["max_position_embeddings"] == c.actor_rollout_ref.rollout.max_model_len == 4096
    assert rope["original_max_position_embeddings"] * rope["factor"] == 4096
    assert spec.worked_answer  # the strict R1-Zero rule: the base model answers in think tags
    layout = megatron_layout(c)
    assert (layout.tp, layout.pp, layout.ep, layout.num_layer_list) == (2, 1, 2, None)
    assert layout.moe_grouped_gemm and layout.moe_tp_extend_ep
    assert checkpoint_dir(c) == Path("/tmp/none/mcore")


def test_fsdp_option_spec_is_the_plain_model() -> None:
    spec = tiny_spec(cfg("ppo_tiny_local_fsdp"))
    assert spec.vocab_multiple == 1 and spec.model_overrides == ()
    assert not spec.worked_answer  # its relaxed format rule: one-token answers


def test_reference_layout_must_equal_the_actors() -> None:
    c = cfg("ppo_tiny_local", "actor_rollout_ref.ref.megatron.expert_model_parallel_size=1")
    with pytest.raises(ValueError, match="ref.megatron.expert_model_parallel_size"):
        megatron_layout(c)


def test_foreign_checkpoint_path_is_refused_before_anything_is_built(tmp_path: Path) -> None:
    c = cfg(
        "ppo_tiny_local",
        f"actor_rollout_ref.actor.megatron.dist_checkpointing_path={tmp_path / 'x'}",
        assets=tmp_path / "assets",
    )
    with pytest.raises(ValueError, match="actor.megatron.dist_checkpointing_path"):
        prepare_for(c, progress=False)
    assert not (tmp_path / "assets").exists()


@pytest.mark.needs_components("vllm_ascend")
def test_the_a3_paths_model_routes_as_deepseek_v3_through_the_256_expert_kernel(tmp_path: Path) -> None:
    """DeepSeek-V3's router as A3 runs it: every router key at the official value, so that vllm-ascend takes its
    `npu_moe_gating_top_k` branch (taken only at exactly 256 routed experts, in its pinned fused_moe.py); the
    built model's score-correction bias makes the biased scores negative, where HF's 0.0 group mask deviates."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl_patches.cpu_proof.tiny_a3 import ROUTER_BIAS_MEAN, ROUTER_BIAS_STD, ROUTER_KEYS
    from verl_patches.cpu_proof.tiny_assets import build_model, build_tokenizer
    from verl_patches.weights.config import official_config

    spec = tiny_spec(cfg())
    overrides, official = dict(spec.model_overrides), official_config()
    for key in (*ROUTER_KEYS, "scoring_func", "topk_method", "norm_topk_prob", "routed_scaling_factor"):
        assert overrides.get(key, official[key]) == official[key], key
    branch = (Path(__file__).resolve().parents[2] / "vllm_ascend/ops/fused_moe.py").read_text()
    assert "if global_num_experts == 256:" in branch and overrides["n_routed_experts"] == 256
    assert (spec.router_bias_mean, spec.router_bias_std) == (ROUTER_BIAS_MEAN, ROUTER_BIAS_STD)

    tok = build_tokenizer(tmp_path, ["What is 1 + 2 ?"], max_operand=2)
    build_model(tmp_path, 64, spec.seed, tok, overrides, router_bias=(spec.router_bias_mean, spec.router_bias_std))
    model = AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32)
    moe_layers = model.model.layers[model.config.first_k_dense_replace :]
    biases = [layer.mlp.gate.e_score_correction_bias for layer in moe_layers]
    assert len(biases) >= 1
    for bias in biases:
        assert bias.shape == (256,) and float(bias.max()) < -0.5 and float(bias.std()) > 0.5 * ROUTER_BIAS_STD
    assert not torch.equal(biases[0], biases[-1])  # each layer its own draw


def test_the_cpu_proofs_entry_is_the_trainer_entry_with_the_tiny_assets_built_first(monkeypatch) -> None:
    from verl_patches.cpu_proof import main_tiny
    from verl_patches.trainer import main_ppo_npu

    seen = []
    monkeypatch.setattr(main_ppo_npu, "main", lambda argv=None, prepare=None: seen.append((argv, prepare)) or 7)
    assert main_tiny.main(["--config-name", "ppo_tiny_local"]) == 7
    assert seen == [(["--config-name", "ppo_tiny_local"], prepare_for)]
