"""Shared fixtures of the rollout tests: one tiny DeepSeek-V3-shaped checkpoint (MLA + MoE) on disk."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _vllm_job_process(vllm_job_process: None) -> None:
    """Every rollout test imports vLLM as a rollout worker of the job does."""


def tiny_config(**overrides):
    from transformers import DeepseekV3Config

    from verl_patches.weights.config import make_tiny_config

    cfg = make_tiny_config(vocab_size=48)
    cfg.update(eos_token_id=1, pad_token_id=0, bos_token_id=2, **overrides)
    cfg = DeepseekV3Config(**cfg)
    cfg._attn_implementation = "eager"
    return cfg


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import DeepseekV3ForCausalLM

    out = tmp_path_factory.mktemp("tiny-dsv3")
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(tiny_config()).save_pretrained(out, safe_serialization=True)
    return out
