"""C1's pure helpers: the trainer-config view D1 reads from the worker's ``actor_rollout_ref`` config, and the
reference's batch-size normalisation for every role that holds a reference."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from verl_patches.patches.verl.workers.megatron_workers import normalize_ref_batch_sizes, trainer_config_view
from verl_patches.trainer.config_compose import compose_config


def test_view_mirrors_data_keys_through_verls_interpolations() -> None:
    full = compose_config(
        "ppo_mindspeed_trainer",
        [
            "data.max_prompt_length=100",
            "data.max_response_length=300",
            "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64",
        ],
    )
    view = trainer_config_view(full.actor_rollout_ref)
    assert view.data.max_prompt_length == 100 and view.data.max_response_length == 300
    assert view.data.train_batch_size == 64
    assert view.algorithm.adv_estimator == "grpo"
    assert view.actor_rollout_ref.actor.megatron is full.actor_rollout_ref.actor.megatron or OmegaConf.to_container(
        view.actor_rollout_ref.actor.megatron
    ) == OmegaConf.to_container(full.actor_rollout_ref.actor.megatron)
    assert trainer_config_view(full) is full  # a full config passes through


def test_the_view_translates_like_the_full_config() -> None:
    from golden_assets import HF_OVERRIDES
    from verl_patches.train_engine.translate import translate_verl_train_configs_to_megatron
    from verl_patches.weights.config import make_tiny_config

    hf = make_tiny_config(64, **HF_OVERRIDES)
    full = compose_config(
        "ppo_mindspeed_trainer",
        [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.optim.lr=1e-6",
        ],
    )
    a = translate_verl_train_configs_to_megatron(full, hf).as_dict()
    b = translate_verl_train_configs_to_megatron(trainer_config_view(full.actor_rollout_ref), hf).as_dict()
    # trainer.total_training_steps is not visible to a worker; it only sizes Megatron's unused lr schedule
    a.pop("train_iters"), b.pop("train_iters")
    assert a == b


def test_ref_normalisation() -> None:
    cfg = OmegaConf.create({"log_prob_micro_batch_size": 16, "log_prob_micro_batch_size_per_gpu": None})
    normalize_ref_batch_sizes(cfg, 4)
    assert cfg.log_prob_micro_batch_size_per_gpu == 4
    cfg = OmegaConf.create({"log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": 8})
    normalize_ref_batch_sizes(cfg, 4)
    assert cfg.log_prob_micro_batch_size_per_gpu == 8
    with pytest.raises(ValueError, match="log_prob_micro_batch_size_per_gpu"):
        normalize_ref_batch_sizes(
            OmegaConf.create({"log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": None}), 4
        )
