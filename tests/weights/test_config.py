"""Training config.json: official values, quantisation/MTP stripped, tiny variant, validation (J3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl_patches.weights.config import (
    load_config,
    make_tiny_config,
    make_training_config,
    official_config,
    validate_config,
)
from verl_patches.weights.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "verl_patches" / "scripts" / "make_config.py"

# The values the issue and vendor item J3 name, checked one by one against the built-in config.
EXPECTED = {
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "first_k_dense_replace": 3,
    "n_routed_experts": 256,
    "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "n_group": 8,
    "topk_group": 4,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "max_position_embeddings": 163840,
    "rope_theta": 10000,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "vocab_size": 129280,
    "rms_norm_eps": 1e-6,
    "aux_loss_alpha": 0.001,
    "seq_aux": True,
    "moe_layer_freq": 1,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_nextn_predict_layers": 0,
    "rope_scaling": {
        "beta_fast": 32,
        "beta_slow": 1,
        "factor": 40,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "type": "yarn",
    },
}


def test_official_training_config_values():
    cfg = make_training_config()
    for key, value in EXPECTED.items():
        assert cfg[key] == value, key
    assert "quantization_config" not in cfg


def test_from_fp8_config_strips_quantisation_and_mtp_keeps_the_rest():
    src = official_config()
    src.update(
        num_nextn_predict_layers=1,
        transformers_version="4.33.1",
        auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]},
    )
    cfg = make_training_config(src)
    assert "quantization_config" not in cfg and cfg["num_nextn_predict_layers"] == 0
    assert cfg["transformers_version"] == "4.33.1" and cfg["auto_map"] == src["auto_map"]
    assert {k: v for k, v in cfg.items() if k != "num_nextn_predict_layers"} == {
        k: v for k, v in src.items() if k not in ("quantization_config", "num_nextn_predict_layers")
    }


def test_tiny_config_has_the_same_keys_and_small_sizes():
    tiny, full = make_tiny_config(300), make_training_config()
    assert set(tiny) == set(full)
    assert tiny["vocab_size"] == 300 and tiny["hidden_size"] <= 128 and 4 <= tiny["num_hidden_layers"] <= 6
    assert 1 <= tiny["first_k_dense_replace"] <= 2 and 8 <= tiny["n_routed_experts"] <= 16
    assert make_tiny_config(64, num_hidden_layers=6, first_k_dense_replace=2)["num_hidden_layers"] == 6
    with pytest.raises(ConfigError, match="'no_such_key'"):
        make_tiny_config(64, no_such_key=1)


def test_tiny_config_builds_and_runs_in_transformers():
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = make_tiny_config(128)
    hc = DeepseekV3Config(**cfg)
    torch.manual_seed(0)
    model = DeepseekV3ForCausalLM(hc).eval()
    moe = model.model.layers[cfg["first_k_dense_replace"]].mlp
    assert len(moe.experts) == cfg["n_routed_experts"] and hasattr(moe, "shared_experts")
    assert hasattr(model.model.layers[0].self_attn, "kv_a_proj_with_mqa")
    with torch.no_grad():
        logits = model(torch.randint(0, 128, (2, 7))).logits
    assert logits.shape == (2, 7, 128) and torch.isfinite(logits).all()


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("n_group", 7, "'n_group'"),
        ("topk_group", 9, "'topk_group'"),
        ("num_attention_heads", 12, "'num_key_value_heads'"),
        ("hidden_size", "7168", "'hidden_size'"),
        ("hidden_size", True, "'hidden_size'"),
        ("norm_topk_prob", 1, "'norm_topk_prob'"),
        ("scoring_func", "relu", "'scoring_func'"),
        ("first_k_dense_replace", 99, "'first_k_dense_replace'"),
        ("qk_rope_head_dim", 63, "'qk_rope_head_dim'"),
        ("num_experts_per_tok", 200, "'num_experts_per_tok'"),
        ("rope_scaling", {"type": "yarn", "factor": 40}, "'rope_scaling.original_max_position_embeddings'"),
        ("model_type", "llama", "'model_type'"),
    ],
)
def test_validation_names_the_key(key, value, fragment):
    cfg = make_training_config()
    cfg[key] = value
    with pytest.raises(ConfigError, match=fragment):
        validate_config(cfg)


def test_missing_key_and_training_form_are_named(tmp_path):
    cfg = make_training_config()
    del cfg["kv_lora_rank"]
    with pytest.raises(ConfigError, match="'kv_lora_rank': missing"):
        validate_config(cfg)
    cfg = make_training_config()
    cfg["quantization_config"] = {}
    validate_config(cfg)  # a valid HF config ...
    with pytest.raises(ConfigError, match="'quantization_config'"):
        validate_config(cfg, training=True)  # ... but not a training config
    p = tmp_path / "config.json"
    p.write_text('{\n  "vocab_size": 3,\n  oops\n}')
    with pytest.raises(ConfigError, match=r"config.json: line 3"):
        load_config(tmp_path)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_cli_from_dir_copies_tokenizer_and_drops_dangling_auto_map(tmp_path):
    src = tmp_path / "fp8"
    src.mkdir()
    cfg = official_config()
    cfg.update(
        num_nextn_predict_layers=1,
        auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        quantization_config={"quant_method": "fp8"},
    )
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "tokenizer.json").write_text("{}")
    (src / "tokenizer_config.json").write_text("{}")
    (src / "model-00001-of-00001.safetensors").write_bytes(b"not copied")
    out = tmp_path / "DeepSeek-V3"
    r = _run("--from", str(src), "--out", str(out))
    assert r.returncode == 0, r.stderr
    written = json.loads((out / "config.json").read_text())
    assert written == make_training_config({k: v for k, v in cfg.items() if k != "auto_map"})
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert "dropped auto_map" in r.stderr

    (src / "configuration_deepseek.py").write_text("# remote code\n")
    out2 = tmp_path / "with_code"
    assert _run("--from", str(src), "--out", str(out2)).returncode == 0
    assert json.loads((out2 / "config.json").read_text())["auto_map"] == cfg["auto_map"]


def test_cli_tiny_and_bad_input(tmp_path):
    r = _run("--tiny", "--vocab-size", "96", "--out", str(tmp_path / "tiny"))
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "tiny" / "config.json").read_text()) == make_tiny_config(96)
    r = _run("--out", str(tmp_path / "bad"), "--set", "n_group=5")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "'n_group'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "bad" / "config.json").exists()
