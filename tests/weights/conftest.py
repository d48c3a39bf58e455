"""Shared tiny DeepSeek-V3-shaped checkpoints for the weight-tool tests.

Sizes are chosen so that FP8 blocks of 128x128 have ragged edges (hidden 160, intermediate 320), TP=2
and EP x TP = 4 divide everything, and there are dense and MoE layers with a shared expert, MLA and an
MTP layer; the checkpoint has several shards with some scales stored in a different shard than their
weight. Generated once per session (a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.weights.config import make_tiny_config
from verl_patches.weights.fp8_cast import run_fp8_cast
from verl_patches.weights.synthetic import write_synthetic_checkpoint

TINY_OVERRIDES = dict(
    hidden_size=160,
    intermediate_size=320,
    moe_intermediate_size=32,
    num_hidden_layers=4,
    first_k_dense_replace=1,
    n_routed_experts=8,
)


@pytest.fixture(scope="session")
def tiny_cfg() -> dict:
    return make_tiny_config(256, **TINY_OVERRIDES)


@pytest.fixture(scope="session")
def fp8_dir(tmp_path_factory, tiny_cfg) -> Path:
    d = tmp_path_factory.mktemp("fp8")
    write_synthetic_checkpoint(d, tiny_cfg, fp8=True, num_shards=4, num_mtp_layers=1, scales_in_next_shard=True, seed=1)
    return d


@pytest.fixture(scope="session")
def bf16_dir(tmp_path_factory, fp8_dir) -> Path:
    d = tmp_path_factory.mktemp("bf16") / "out"
    run_fp8_cast(fp8_dir, d, progress=False)
    return d


@pytest.fixture(scope="session")
def hf_dir(tmp_path_factory, tiny_cfg) -> Path:
    """A BF16 HF checkpoint of the training config (no MTP), 3 shards."""
    d = tmp_path_factory.mktemp("hf")
    write_synthetic_checkpoint(d, tiny_cfg, fp8=False, num_shards=3, seed=2)
    return d
