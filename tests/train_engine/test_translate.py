"""D1 translation (pure), D2 whitelist, argv rendering, the compile toggle."""

from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from tests.train_engine.tiny_dsv3 import VENDOR_SWITCHES, verl_config
from verl_patches import compile_toggle
from verl_patches.train_engine.argv import parse_args_from_config
from verl_patches.train_engine.megatron_config import KNOWN_ARGS, MegatronConfig
from verl_patches.train_engine.translate import (
    CONSUMED_PROFILE_KEYS,
    TranslationError,
    translate_verl_train_configs_to_megatron,
)
from verl_patches.weights.config import make_training_config

DSV3 = make_training_config()  # DeepSeek-V3's own config.json, as the converter writes it


def a3_config(**megatron):
    settings = dict(
        tensor_model_parallel_size=4,
        pipeline_model_parallel_size=8,
        expert_model_parallel_size=8,
        sequence_parallel=True,
        swap_optimizer=True,
        pipeline_parallel_num_layer_list=[7, 7, 8, 8, 8, 8, 8, 7],
    )
    settings.update(megatron)
    cfg = verl_config(**settings)
    cfg["data"].update(train_batch_size=512, max_prompt_length=1024, max_response_length=3072)
    cfg["actor_rollout_ref"]["rollout"]["n"] = 16
    cfg["actor_rollout_ref"]["actor"]["ppo_micro_batch_size_per_gpu"] = 1
    cfg["actor_rollout_ref"]["model"].update(
        enable_gradient_checkpointing=True,
        gradient_checkpointing_kwargs={
            "activations_checkpoint_granularity": "full",
            "activations_checkpoint_method": "block",
            "activations_checkpoint_num_layers": 8,
        },
    )
    return OmegaConf.create(cfg)


def test_a3_profile_snapshot():
    out = translate_verl_train_configs_to_megatron(a3_config(), DSV3)
    assert out["global_batch_size"] == 8192 and out["micro_batch_size"] == 1 and out["seq_length"] == 4096
    assert out["num_layer_list"] == "7,7,8,8,8,8,8,7"
    assert (
        out["tensor_model_parallel_size"],
        out["pipeline_model_parallel_size"],
        out["expert_model_parallel_size"],
    ) == (4, 8, 8)
    assert out["sequence_parallel"] and out["swap_optimizer"] and out["use_distributed_optimizer"]
    assert out["num_query_groups"] == 128 and out["group_query_attention"] is False
    assert out["multi_head_latent_attention"] and out["q_lora_rank"] == 1536 and out["v_head_dim"] == 128
    assert out["rope_scaling_type"] == "yarn" and out["rope_scaling_factor"] == 40.0
    assert out["moe_router_load_balancing_type"] == "noaux_tc" and out["moe_router_score_function"] == "sigmoid"
    assert out["num_experts"] == 256 and out["moe_router_topk"] == 8 and out["first_k_dense_replace"] == 3
    assert out["recompute_granularity"] == "full" and out["recompute_num_layers"] == 8
    for flag in (*VENDOR_SWITCHES, "bf16", "variable_seq_lengths"):
        assert out[flag] is True, flag
    assert out["shape_order"] == "BNSD" and out["spec"][0].endswith("deepseek_spec")


def test_translation_is_pure_and_json_stable():
    a = translate_verl_train_configs_to_megatron(a3_config(), DSV3).as_dict()
    b = translate_verl_train_configs_to_megatron(a3_config(), dict(DSV3)).as_dict()
    assert a == b and json.loads(json.dumps(a)) == a


def test_profile_keys_are_consumed():
    base = translate_verl_train_configs_to_megatron(a3_config(fix_router=False), DSV3)
    fixed = translate_verl_train_configs_to_megatron(a3_config(fix_router=True), DSV3)
    assert not base["fix_router"] and fixed["fix_router"]
    assert [k.rsplit(".", 1)[1] for k in CONSUMED_PROFILE_KEYS] == [
        "pipeline_parallel_num_layer_list",
        "swap_optimizer",
        "fix_router",
    ]


@pytest.mark.parametrize(
    "change, key",
    [
        ({"pipeline_parallel_num_layer_list": [7, 7, 8, 8, 8, 8, 8, 8]}, "sums to 62"),
        ({"pipeline_parallel_num_layer_list": [8, 8]}, "2 entries"),
        ({"pipeline_parallel_num_layer_list": None}, "pipeline_parallel_num_layer_list"),
        ({"optimizer_offload": True}, "swap_optimizer and"),
        ({"sequence_parallel": False}, "sequence_parallel must be true"),
        ({"tensor_model_parallel_size": "4"}, "tensor_model_parallel_size must be an integer"),
    ],
)
def test_validation_errors_name_the_key(change, key):
    with pytest.raises(TranslationError, match=key):
        translate_verl_train_configs_to_megatron(a3_config(**change), DSV3)


def test_only_grpo_and_missing_hf_keys_are_named():
    cfg = a3_config()
    cfg.algorithm.adv_estimator = "gae"
    with pytest.raises(TranslationError, match="adv_estimator"):
        translate_verl_train_configs_to_megatron(cfg, DSV3)
    with pytest.raises(TranslationError, match="'kv_lora_rank'"):
        translate_verl_train_configs_to_megatron(a3_config(), {k: v for k, v in DSV3.items() if k != "kv_lora_rank"})


def test_hf_config_read_from_model_path(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(DSV3))
    cfg = a3_config()
    cfg.actor_rollout_ref.model.path = str(tmp_path)
    assert translate_verl_train_configs_to_megatron(cfg)["num_layers"] == 61
    (tmp_path / "config.json").write_text("{bad")
    with pytest.raises(TranslationError, match="line 1"):
        translate_verl_train_configs_to_megatron(cfg)


def test_megatron_config_is_a_whitelist():
    cfg = MegatronConfig({"tensor-model-parallel-size": 2})
    assert cfg["tensor_model_parallel_size"] == 2 and cfg.tensor_model_parallel_size == 2
    assert len(cfg) == len(KNOWN_ARGS)
    with pytest.raises(ValueError, match="tensor_model_paralel_size"):
        cfg.update({"tensor_model_paralel_size": 2})


def test_argv_rendering_rules():
    argv = parse_args_from_config(
        {"a_b": True, "off": False, "none": None, "lst": [1, "x"], "n": 3, "s": "a b", "empty": []}
    )
    assert argv == ["--a-b", "--lst", "1", "x", "--n=3", "--s=a b"]
    with pytest.raises(TypeError, match="mapping"):
        parse_args_from_config({"d": {"x": 1}})


def test_full_translation_renders_and_parses_with_mindspeed_llm_parser_names():
    argv = parse_args_from_config(translate_verl_train_configs_to_megatron(a3_config(), DSV3))
    assert "--num-layer-list=7,7,8,8,8,8,8,7" in argv and "--moe-tp-extend-ep" in argv
    assert "--spec" in argv and argv[argv.index("--spec") + 2] == "layer_spec"


def test_compile_toggle_keeps_the_real_torch_compile(monkeypatch):
    real = torch.compile
    monkeypatch.setattr(compile_toggle, "_REAL", None)
    assert compile_toggle.capture_real_compile() is real
    monkeypatch.setattr(torch, "compile", torch.jit.script)  # what MindSpeed-LLM's adaptor does
    with compile_toggle.real_torch_compile():
        assert torch.compile is real
    assert torch.compile is torch.jit.script
    compile_toggle.restore_real_compile()
    assert torch.compile is real
    with compile_toggle.mindspeed_compile():
        assert torch.compile is torch.jit.script
    assert torch.compile is real


def test_reference_role_uses_its_micro_batch_and_shares_the_layout():
    cfg = a3_config()
    cfg.actor_rollout_ref.ref = {"log_prob_micro_batch_size_per_gpu": 8, "megatron": {"tensor_model_parallel_size": 4}}
    ref = translate_verl_train_configs_to_megatron(cfg, DSV3, role="ref")
    actor = translate_verl_train_configs_to_megatron(cfg, DSV3)
    assert ref["micro_batch_size"] == 8 and actor["micro_batch_size"] == 1
    assert {k: v for k, v in ref.items() if k != "micro_batch_size"} == {
        k: v for k, v in actor.items() if k != "micro_batch_size"
    }
    cfg.actor_rollout_ref.ref.megatron.tensor_model_parallel_size = 2
    with pytest.raises(TranslationError, match="ref.megatron.tensor_model_parallel_size=2"):
        translate_verl_train_configs_to_megatron(cfg, DSV3, role="ref")


def test_adaptor_switch_check_ignores_values(monkeypatch):
    from verl_patches.train_engine import initialize

    monkeypatch.setattr(initialize, "_ADAPTOR_ARGV", ["p", "--use-flash-attn", "--micro-batch-size=1"])
    initialize.apply_mindspeed_adaptor(["p", "--use-flash-attn", "--micro-batch-size=8"])  # no error, no re-import
    with pytest.raises(initialize.TrainEngineInitError, match="--moe-grouped-gemm"):
        initialize.apply_mindspeed_adaptor(["p", "--use-flash-attn", "--moe-grouped-gemm"])
