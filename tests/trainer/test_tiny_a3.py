"""The tiny run's A3-path assets, derived from the composed config: spec, Megatron layout, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from verl_patches.trainer.config_compose import compose_config, resolved
from verl_patches.trainer.tiny_a3 import (
    MEGATRON_MODEL_OVERRIDES,
    VOCAB_MULTIPLE,
    checkpoint_dir,
    megatron_layout,
    prepare_for,
    tiny_spec,
)


def cfg(name: str = "ppo_tiny_local", *overrides: str, assets: Path = Path("/tmp/none")):
    return resolved(compose_config(name, [f"overlay.tiny_assets_dir={assets}", *overrides]))


def test_a3_path_spec_and_layout() -> None:
    c = cfg()
    spec = tiny_spec(c)
    assert spec.vocab_multiple == VOCAB_MULTIPLE and spec.seed == 1 and spec.max_operand == 2
    overrides = dict(spec.model_overrides)
    assert {k: overrides[k] for k in MEGATRON_MODEL_OVERRIDES} == MEGATRON_MODEL_OVERRIDES
    assert overrides["rope_scaling"]["original_max_position_embeddings"] == 64
    layout = megatron_layout(c)
    assert (layout.tp, layout.pp, layout.ep, layout.num_layer_list) == (2, 1, 2, None)
    assert layout.moe_grouped_gemm and layout.moe_tp_extend_ep
    assert checkpoint_dir(c) == Path("/tmp/none/mcore")


def test_fsdp_option_spec_is_the_plain_model() -> None:
    spec = tiny_spec(cfg("ppo_tiny_local_fsdp"))
    assert spec.vocab_multiple == 1 and spec.model_overrides == ()


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
