"""The composed trainer configs (vendor items A3, §1, §4): every profile carries the vendor's layout and
hyper-parameters, every upstream key we do not set keeps verl v0.4.0's own default, a typo in an override
is an error naming the key, and the semantic checks name the key to change."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

from verl_patches.driver.config_checks import OverlayConfigError, check_config, raise_on_problems
from verl_patches.trainer.config_compose import (
    CONFIG_DIR,
    REPO_ROOT,
    VERL_CONFIG_DIR,
    ConfigCompositionError,
    compose_config,
    resolved,
)

A = "actor_rollout_ref.actor"
M = f"{A}.megatron"
R = "actor_rollout_ref.rollout"
REF = "actor_rollout_ref.ref"
PROFILE_DIR = CONFIG_DIR / "profile"
PROD_PROFILES = ("a3_256die_true_weight", "a3_256die_random_init")


@pytest.fixture(autouse=True)
def _no_path_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The profiles read these through ${oc.env:...}; a developer's shell must not change the outcome.
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):
        monkeypatch.delenv(name, raising=False)


@cache
def composed(profile: str, *overrides: str) -> DictConfig:
    """Resolved config of a profile ('tiny', 'base' = no profile, or a profile yaml name)."""
    if profile == "tiny":
        return resolved(compose_config("ppo_tiny_local", list(overrides)))
    prof = [] if profile == "base" else [f"profile={profile}"]
    return resolved(compose_config("ppo_mindspeed_trainer", prof + list(overrides)))


def raw(config_name: str, *overrides: str) -> DictConfig:
    """Composed but unresolved: interpolations kept, to compare with verl's yaml as written."""
    return compose_config(config_name, list(overrides))


def sel(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a plain container as dotted keys; lists are leaves."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def yaml_keys(path: Path) -> set[str]:
    return set(flatten(OmegaConf.to_container(OmegaConf.load(path), resolve=False)))


# ---- the production profiles: reference §1 and §4 ------------------------------------------------


@pytest.mark.parametrize("profile", PROD_PROFILES)
def test_production_profile_layout_matches_reference(profile: str) -> None:
    c = composed(profile)
    assert sel(c, f"{M}.tensor_model_parallel_size") == 4
    assert sel(c, f"{M}.pipeline_model_parallel_size") == 8
    assert sel(c, f"{M}.expert_model_parallel_size") == 8
    assert sel(c, f"{M}.context_parallel_size") == 1
    assert list(sel(c, f"{M}.pipeline_parallel_num_layer_list")) == [7, 7, 8, 8, 8, 8, 8, 7]
    assert sum(sel(c, f"{M}.pipeline_parallel_num_layer_list")) == 61  # DeepSeek-V3's num_hidden_layers
    assert sel(c, f"{M}.sequence_parallel") is True
    assert sel(c, f"{M}.swap_optimizer") is True
    assert sel(c, f"{M}.optimizer_offload") is False  # swap optimizer replaces it
    assert sel(c, f"{M}.param_offload") is True and sel(c, f"{M}.grad_offload") is True
    # the ref shares the actor's layout (same worker, same ranks) with its parameters offloaded
    for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
        assert sel(c, f"{REF}.megatron.{k}") == sel(c, f"{M}.{k}")
    assert sel(c, f"{REF}.megatron.param_offload") is True
    assert sel(c, "trainer.nnodes") == 16 and sel(c, "trainer.n_gpus_per_node") == 16
    assert sel(c, f"{R}.tensor_model_parallel_size") == 2
    assert sel(c, "overlay.dies_per_card") == 2


@pytest.mark.parametrize("profile", PROD_PROFILES)
def test_production_profile_hyperparameters_match_reference(profile: str) -> None:
    c = composed(profile)
    assert sel(c, "algorithm.adv_estimator") == "grpo"
    assert sel(c, "algorithm.use_kl_in_reward") is False
    assert sel(c, "algorithm.kl_ctrl.kl_coef") == pytest.approx(0.001)
    assert sel(c, "data.train_batch_size") == 512
    assert sel(c, f"{A}.ppo_mini_batch_size") == 512  # one optimizer step per rollout
    assert sel(c, f"{A}.ppo_micro_batch_size_per_gpu") == 1
    assert sel(c, f"{A}.ppo_epochs") == 1
    assert sel(c, "data.max_prompt_length") == 1024
    assert sel(c, "data.max_response_length") == 3072
    assert sel(c, "data.filter_overlong_prompts") is True
    assert sel(c, "data.truncation") == "error"
    assert sel(c, f"{A}.optim.lr") == pytest.approx(1e-6)
    assert sel(c, f"{A}.optim.clip_grad") == pytest.approx(1.0)
    assert sel(c, f"{A}.use_kl_loss") is True
    assert sel(c, f"{A}.kl_loss_coef") == pytest.approx(0.001)
    assert sel(c, f"{A}.kl_loss_type") == "low_var_kl"
    assert sel(c, f"{A}.entropy_coeff") == 0
    assert sel(c, f"{A}.recompute_old_log_prob") is False
    assert sel(c, f"{R}.name") == "vllm"
    assert sel(c, f"{R}.n") == 16
    assert sel(c, f"{R}.temperature") == pytest.approx(0.9)
    assert sel(c, f"{R}.top_k") == 50
    assert sel(c, f"{R}.top_p") == pytest.approx(0.9)
    assert sel(c, f"{R}.max_num_batched_tokens") == 1024
    assert sel(c, f"{R}.enable_chunked_prefill") is True
    assert sel(c, f"{R}.gpu_memory_utilization") == pytest.approx(0.8)
    assert sel(c, f"{R}.enforce_eager") is False
    assert sel(c, f"{R}.log_prob_micro_batch_size_per_gpu") == 4
    assert sel(c, f"{REF}.log_prob_micro_batch_size_per_gpu") == 8
    assert sel(c, "trainer.balance_batch") is False
    assert sel(c, "trainer.device") == "npu"
    assert sel(c, "trainer.critic_warmup") == 0
    # issue 34: checkpoints and validation on, into a folder the user names (CKPT_DIR; no default here)
    assert sel(c, "trainer.save_freq") == 10 and sel(c, "trainer.max_actor_ckpt_to_keep") == 2
    assert sel(c, "trainer.default_local_dir") is None
    assert sel(c, "trainer.test_freq") == 10 and sel(c, "trainer.val_before_train") is True
    assert sel(c, "overlay.val_max_prompts") == 1024
    assert sel(c, "trainer.total_epochs") == 1
    assert list(sel(c, "trainer.logger")) == ["console", "tensorboard"]
    assert sel(c, "trainer.experiment_name") == "dsv3_671b_verl_mindspeedllm_vllm"
    assert check_config(c) == []


def test_true_weight_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    c = composed("a3_256die_true_weight")
    assert sel(c, "overlay.profile") == "a3-256die-true-weight"
    assert sel(c, "overlay.vllm_dp_size") == 64  # two vLLM instances of DP64 x TP2
    assert sel(c, f"{R}.ignore_eos") is False
    assert sel(c, f"{M}.fix_router") is False
    assert sel(c, f"{A}.load_weight") is True and sel(c, f"{REF}.load_weight") is True
    assert sel(c, f"{M}.use_dist_checkpointing") is True
    assert sel(c, f"{REF}.megatron.use_dist_checkpointing") is True
    assert sel(c, "data.trust_remote_code") is True and sel(c, f"{R}.trust_remote_code") is True
    assert sel(c, "actor_rollout_ref.model.enable_gradient_checkpointing") is True
    kw = sel(c, "actor_rollout_ref.model.gradient_checkpointing_kwargs")
    assert (
        kw.activations_checkpoint_granularity,
        kw.activations_checkpoint_method,
        kw.activations_checkpoint_num_layers,
    ) == ("full", "block", 8)
    assert sel(c, "trainer.project_name") == "verl_grpo_example_true_weight"
    # paths come from the launch environment, never from hand edits
    assert sel(c, f"{M}.dist_checkpointing_path") is None
    monkeypatch.setenv("DIST_CKPT_PATH", "/ckpt/dsv3-tp4pp8ep8")
    monkeypatch.setenv("MODEL_PATH", "/models/DeepSeek-V3")
    monkeypatch.setenv("DATA_DIR", "/data/deepscaler")
    c = resolved(raw("ppo_mindspeed_trainer", "profile=a3_256die_true_weight"))
    assert sel(c, f"{M}.dist_checkpointing_path") == "/ckpt/dsv3-tp4pp8ep8"
    assert sel(c, f"{REF}.megatron.dist_checkpointing_path") == "/ckpt/dsv3-tp4pp8ep8"
    assert sel(c, "actor_rollout_ref.model.path") == "/models/DeepSeek-V3"
    assert sel(c, "data.train_files") == "/data/deepscaler/train.parquet"
    assert sel(c, "data.val_files") == "/data/deepscaler/test.parquet"


def test_random_init_differences(monkeypatch: pytest.MonkeyPatch) -> None:
    c = composed("a3_256die_random_init")
    assert sel(c, "overlay.profile") == "a3-256die-random-init"
    assert sel(c, "overlay.vllm_dp_size") == 128  # one vLLM instance of DP128 x TP2 (EP256)
    assert sel(c, f"{R}.ignore_eos") is True  # forced 3K responses
    assert sel(c, f"{M}.fix_router") is True  # benchmark mode only
    assert sel(c, f"{A}.load_weight") is False and sel(c, f"{REF}.load_weight") is False
    assert sel(c, f"{M}.use_dist_checkpointing") is False
    assert sel(c, f"{REF}.megatron.use_dist_checkpointing") is False
    assert sel(c, "data.trust_remote_code") is False and sel(c, f"{R}.trust_remote_code") is False
    assert sel(c, "actor_rollout_ref.model.enable_gradient_checkpointing") is False
    assert sel(c, "trainer.project_name") == "verl_grpo_example_init_weight"
    monkeypatch.setenv("DIST_CKPT_PATH", "/ckpt/dsv3-tp4pp8ep8")  # a random-init run never loads it
    c = resolved(raw("ppo_mindspeed_trainer", "profile=a3_256die_random_init"))
    assert sel(c, f"{M}.dist_checkpointing_path") is None
    assert sel(c, f"{REF}.megatron.dist_checkpointing_path") is None


def test_fix_router_only_in_random_init_and_checkpoint_only_in_true_weight() -> None:
    tw, ri = composed("a3_256die_true_weight"), composed("a3_256die_random_init")
    assert [sel(c, f"{M}.fix_router") for c in (tw, ri)] == [False, True]
    assert [sel(c, f"{A}.load_weight") for c in (tw, ri)] == [True, False]
    assert [sel(c, f"{M}.use_dist_checkpointing") for c in (tw, ri)] == [True, False]


def test_tiny_profile_values() -> None:
    """The tiny run takes the A3 path: Megatron actor/ref (TP2 x EP2, fp32), the vllm rollout seam, fused role,
    no old-log-prob pass, validation every 20 steps."""
    from verl_patches.device import device_kind

    c = composed("tiny")
    assets = Path(sel(c, "overlay.tiny_assets_dir"))
    assert sel(c, "overlay.profile") == "tiny"
    assert sel(c, "overlay.fused_actor_rollout_ref") is True
    assert sel(c, "overlay.dies_per_card") == 1
    assert assets.is_absolute() and assets.is_relative_to(REPO_ROOT)
    assert sel(c, "data.train_files") == str(assets / "data" / "train.parquet")
    assert sel(c, "data.val_files") == str(assets / "data" / "test.parquet")
    assert sel(c, "actor_rollout_ref.model.path") == str(assets / "model")
    assert sel(c, "algorithm.adv_estimator") == "grpo"
    assert sel(c, f"{A}.strategy") == "megatron" and sel(c, f"{REF}.strategy") == "megatron"
    assert sel(c, f"{R}.name") == "vllm" and sel(c, f"{R}.tensor_model_parallel_size") == 2  # as A3
    assert sel(c, "overlay.vllm_dp_size") == 2  # one instance of DP2 x TP2 over the four ranks (EP4)
    assert sel(c, f"{A}.recompute_old_log_prob") is False
    assert sel(c, f"{A}.ppo_mini_batch_size") == sel(c, "data.train_batch_size")
    for role in (A, REF):
        assert sel(c, f"{role}.megatron.tensor_model_parallel_size") == 2
        assert sel(c, f"{role}.megatron.expert_model_parallel_size") == 2
        assert sel(c, f"{role}.megatron.dist_checkpointing_path") == str(assets / "mcore")
    assert sel(c, f"{M}.params_dtype") == "float32" and sel(c, f"{R}.dtype") == "float32"
    assert sel(c, "data.dataloader_num_workers") == 0
    assert sel(c, "trainer.device") == device_kind()
    assert sel(c, "trainer.nnodes") == 1 and sel(c, "trainer.n_gpus_per_node") == 4
    assert sel(c, "ray_init.num_cpus") >= sel(c, "trainer.n_gpus_per_node") + 1
    assert sel(c, "trainer.test_freq") == 20 and sel(c, "trainer.total_training_steps") == 60
    # no checkpoints in the 60-step run, into verl's relative folder, as before the A3 profiles turned them on
    assert sel(c, "trainer.save_freq") == -1
    assert sel(c, "trainer.default_local_dir") == "checkpoints/verl_patches_tiny/tiny_dsv3_grpo_a3_path"
    assert sel(c, "trainer.balance_batch") is False
    assert sel(c, f"{A}.use_kl_loss") is True and sel(c, f"{A}.kl_loss_type") == "low_var_kl"
    assert "tensorboard" in sel(c, "trainer.logger")
    assert sel(c, "data.seed") == sel(c, "overlay.tiny_seed")
    assert Path(sel(c, "custom_reward_function.path")).is_file()
    assert check_config(c) == []


def test_tiny_fsdp_option_values() -> None:
    c = resolved(compose_config("ppo_tiny_local_fsdp", []))
    assert sel(c, f"{A}.strategy") == "fsdp" and sel(c, f"{R}.name") == "hf"
    assert sel(c, "actor_rollout_ref.model.use_remove_padding") is False
    assert sel(c, "overlay.fused_actor_rollout_ref") is True
    assert sel(c, "trainer.nnodes") == 1 and sel(c, "trainer.n_gpus_per_node") == 1
    assert check_config(c) == []


@pytest.mark.parametrize("profile", ["base", *PROD_PROFILES, "tiny"])
def test_reward_function_is_ours_and_exists(profile: str) -> None:
    c = composed(profile)
    path = Path(sel(c, "custom_reward_function.path"))
    assert path == REPO_ROOT / "verl_patches" / "reward" / "entry.py" and path.is_file()
    assert sel(c, "custom_reward_function.name") == "compute_score"
    assert f"def {sel(c, 'custom_reward_function.name')}(" in path.read_text()


# ---- upstream keys keep upstream defaults ----------------------------------------------------------


def _check_upstream_defaults(config_name: str, verl_yaml: str, our_yamls: list[Path], *overrides: str) -> int:
    upstream = flatten(OmegaConf.to_container(OmegaConf.load(VERL_CONFIG_DIR / verl_yaml), resolve=False))
    ours = flatten(OmegaConf.to_container(raw(config_name, *overrides), resolve=False))
    set_by_us = set().union(*(yaml_keys(p) for p in our_yamls))
    compared = 0
    for key, value in upstream.items():
        assert key in ours, f"upstream key {key} is missing from the composed {config_name}"
        if key in set_by_us:
            continue
        assert ours[key] == value, f"{key}: upstream default {value!r}, composed {ours[key]!r}"
        compared += 1
    return compared


@pytest.mark.parametrize("profile", [None, *PROD_PROFILES])
def test_megatron_config_keeps_every_upstream_default_it_does_not_set(profile: str | None) -> None:
    files = [CONFIG_DIR / "ppo_mindspeed_trainer.yaml"]
    if profile:
        files += [PROFILE_DIR / f"{profile}.yaml", PROFILE_DIR / "a3_256die_true_weight.yaml"]
    compared = _check_upstream_defaults(
        "ppo_mindspeed_trainer", "ppo_megatron_trainer.yaml", files, *([f"profile={profile}"] if profile else [])
    )
    assert compared > 150  # nearly all of verl's keys are compared, not a handful


def test_tiny_config_keeps_every_upstream_default_it_does_not_set() -> None:
    compared = _check_upstream_defaults(
        "ppo_tiny_local",
        "ppo_megatron_trainer.yaml",
        [
            CONFIG_DIR / "ppo_mindspeed_trainer.yaml",
            PROFILE_DIR / "a3_256die_true_weight.yaml",
            CONFIG_DIR / "ppo_tiny_local.yaml",
        ],
    )
    assert compared > 150
    compared = _check_upstream_defaults(
        "ppo_tiny_local_fsdp", "ppo_trainer.yaml", [CONFIG_DIR / "ppo_tiny_local_fsdp.yaml"]
    )
    assert compared > 150


def test_sample_of_upstream_defaults_by_name() -> None:
    """A readable sample of the above: keys no profile sets have the values verl's yaml gives them."""
    upstream = OmegaConf.load(VERL_CONFIG_DIR / "ppo_megatron_trainer.yaml")
    for profile in ("base", *PROD_PROFILES):
        c = composed(profile)
        for key in (
            f"{A}.clip_ratio",
            f"{A}.loss_agg_mode",
            f"{A}.strategy",
            f"{M}.seed",
            f"{M}.use_distributed_optimizer",
            f"{R}.dtype",
            f"{R}.free_cache_engine",
            f"{R}.do_sample",
            "algorithm.gamma",
            "algorithm.lam",
            "algorithm.norm_adv_by_std_in_grpo",
            "data.prompt_key",
            "trainer.resume_mode",
            "critic.strategy",
        ):
            assert sel(c, key) == OmegaConf.select(upstream, key), (profile, key)


def test_without_profile_the_overlay_changes_no_upstream_value() -> None:
    c, upstream = composed("base"), OmegaConf.load(VERL_CONFIG_DIR / "ppo_megatron_trainer.yaml")
    for key in (
        f"{M}.tensor_model_parallel_size",
        f"{M}.param_offload",
        f"{M}.optimizer_offload",
        f"{REF}.megatron.param_offload",
        "trainer.nnodes",
        "data.train_batch_size",
        f"{R}.n",
        "algorithm.adv_estimator",
    ):
        assert sel(c, key) == OmegaConf.select(upstream, key), key
    assert sel(c, "overlay.profile") == "custom"


# ---- our own keys ---------------------------------------------------------------------------------


def test_added_keys_exist_with_documented_defaults() -> None:
    upstream = OmegaConf.load(VERL_CONFIG_DIR / "ppo_megatron_trainer.yaml")
    c = composed("base")
    ours = {
        f"{A}.recompute_old_log_prob": False,
        f"{A}.use_packed_seq": False,
        f"{A}.max_packing_token_size": 2048,
        f"{M}.swap_optimizer": False,
        f"{M}.pipeline_parallel_num_layer_list": None,
        f"{M}.fix_router": False,
        f"{R}.trust_remote_code": False,
        "overlay.profile": "custom",
        "overlay.dies_per_card": 2,
        "overlay.fused_actor_rollout_ref": True,
    }
    for key, default in ours.items():
        assert OmegaConf.select(upstream, key, default="<absent>") == "<absent>", f"{key} is not ours: verl has it"
        assert sel(c, key) == default, key
    # the ref's packing settings follow the actor's (interpolations, not copies)
    rc = raw("ppo_mindspeed_trainer")
    for k in ("use_dynamic_bsz", "use_packed_seq", "max_packing_token_size"):
        assert OmegaConf.to_container(rc, resolve=False)["actor_rollout_ref"]["ref"][k] == f"${{{A}.{k}}}"
    c2 = composed("base", f"{A}.use_packed_seq=True", f"{A}.max_packing_token_size=4096")
    assert sel(c2, f"{REF}.use_packed_seq") is True and sel(c2, f"{REF}.max_packing_token_size") == 4096


def test_added_keys_accept_overrides() -> None:
    c = composed(
        "base",
        f"{A}.recompute_old_log_prob=True",
        f"{M}.pipeline_parallel_num_layer_list=[1,2]",
        f"{M}.fix_router=True",
    )
    assert sel(c, f"{A}.recompute_old_log_prob") is True
    assert list(sel(c, f"{M}.pipeline_parallel_num_layer_list")) == [1, 2]
    assert sel(c, f"{M}.fix_router") is True


def test_nothing_is_written_into_the_vendored_verl_tree() -> None:
    ours = {p.name for p in CONFIG_DIR.glob("*.yaml")}
    assert ours == {"ppo_mindspeed_trainer.yaml", "ppo_tiny_local.yaml", "ppo_tiny_local_fsdp.yaml"}
    assert not any((VERL_CONFIG_DIR / n).exists() for n in ours)
    assert not (REPO_ROOT / "verl" / "trainer" / "main_ppo_npu.py").exists()


# ---- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, key",
    [
        (f"{A}.ppo_epoch=2", f"{A}.ppo_epoch"),  # ppo_epochs
        (f"{M}.swap_optimiser=True", f"{M}.swap_optimiser"),  # swap_optimizer
        ("trainer.n_gpu_per_node=8", "trainer.n_gpu_per_node"),  # n_gpus_per_node
        (f"{R}.temprature=0.5", f"{R}.temprature"),  # temperature
    ],
)
@pytest.mark.parametrize("profile", ["a3_256die_true_weight", "tiny"])
def test_typo_in_an_override_is_an_error_naming_the_key(profile: str, override: str, key: str) -> None:
    name = "ppo_tiny_local" if profile == "tiny" else "ppo_mindspeed_trainer"
    prof = [] if profile == "tiny" else [f"profile={profile}"]
    with pytest.raises(ConfigCompositionError) as e:
        compose_config(name, prof + [override])
    assert key in str(e.value)


def test_unknown_profile_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigCompositionError) as e:
        compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_ture_weight"])
    assert "a3_256die_ture_weight" in str(e.value)


def _problems(*overrides: str, profile: str = "a3_256die_true_weight") -> list[str]:
    """The checks other than D2D's (the cache off; its own refusals are tested below)."""
    return check_config(composed(profile, "overlay.d2d_tensor_cache=False", *overrides), environ={})


def test_check_ppo_epochs_with_skipped_old_log_prob() -> None:
    problems = _problems(f"{A}.ppo_epochs=2")
    assert len(problems) == 1
    assert f"{A}.recompute_old_log_prob" in problems[0] and f"{A}.ppo_epochs" in problems[0]
    assert _problems(f"{A}.ppo_epochs=2", f"{A}.recompute_old_log_prob=True") == []


def test_check_gae_with_skipped_old_log_prob() -> None:
    problems = _problems("algorithm.adv_estimator=gae")
    assert len(problems) == 1 and "algorithm.adv_estimator" in problems[0] and "gae" in problems[0]
    assert _problems("algorithm.adv_estimator=gae", f"{A}.recompute_old_log_prob=True") == []


def test_check_one_mini_batch_per_rollout_with_skipped_old_log_prob() -> None:
    problems = _problems("data.train_batch_size=1024")
    assert len(problems) == 1
    assert "data.train_batch_size" in problems[0] and f"{A}.ppo_mini_batch_size" in problems[0]
    assert "1024" in problems[0] and "512" in problems[0]
    assert _problems("data.train_batch_size=1024", f"{A}.recompute_old_log_prob=True") == []


def test_check_swap_optimizer_with_optimizer_offload() -> None:
    problems = _problems(f"{M}.optimizer_offload=True")
    assert len(problems) == 1 and f"{M}.optimizer_offload" in problems[0] and "swap_optimizer" in problems[0]
    assert _problems(f"{M}.optimizer_offload=True", f"{M}.swap_optimizer=False") == []


def test_check_swap_optimizer_needs_bf16_parameters() -> None:
    """MindSpeed's swap optimizer keeps no Adam state for fp32 parameters (the tiny run trains in fp32)."""
    problems = check_config(composed("tiny", f"{M}.swap_optimizer=True"), environ={})
    assert len(problems) == 1 and f"{M}.swap_optimizer" in problems[0] and f"{M}.params_dtype" in problems[0]
    assert check_config(composed("tiny"), environ={}) == []


def test_check_layer_list_length() -> None:
    problems = _problems(f"{M}.pipeline_parallel_num_layer_list=[7,7,8,8,8,8,15]")
    assert len(problems) == 1
    assert f"{M}.pipeline_parallel_num_layer_list" in problems[0]
    assert f"{M}.pipeline_model_parallel_size" in problems[0] and "7 entries" in problems[0]
    assert (
        _problems(
            f"{M}.pipeline_parallel_num_layer_list=[15,15,16,15]",
            f"{M}.pipeline_model_parallel_size=4",
            f"{REF}.megatron.pipeline_model_parallel_size=4",
        )
        == []
    )


def test_check_layer_list_entries_positive() -> None:
    problems = _problems(f"{M}.pipeline_parallel_num_layer_list=[7,7,8,8,8,8,15,0]")
    assert any("positive integers" in p and f"{M}.pipeline_parallel_num_layer_list" in p for p in problems)


def test_every_problem_is_listed_and_raised() -> None:
    cfg = composed(
        "a3_256die_true_weight", f"{A}.ppo_epochs=2", f"{M}.optimizer_offload=True", "data.train_batch_size=256"
    )
    assert len(check_config(cfg)) == 3
    with pytest.raises(OverlayConfigError) as e:
        raise_on_problems(cfg)
    for key in (f"{A}.ppo_epochs", f"{M}.optimizer_offload", "data.train_batch_size"):
        assert key in str(e.value)


# ---- skipped old-log-prob and D2D (vendor items A2, C2) ---------------------------------------------

D2D_ON = {"D2D_DATA_TRANSFER": "1"}


def test_skip_needs_the_megatron_actor_and_sync_rollout() -> None:
    problems = _problems(f"{A}.strategy=fsdp", f"{REF}.strategy=fsdp", "critic.strategy=fsdp")
    assert any(f"{A}.strategy=megatron" in p and "fsdp" in p for p in problems)
    problems = _problems(f"{R}.mode=async")
    # the skipped pass and TIS (it reads the log-probs only the sync rollout returns) each need it, by key
    assert len(problems) == 2 and all(f"{R}.mode=sync" in p for p in problems)


@pytest.mark.parametrize(
    "override, key",
    [
        (f"{A}.use_kl_loss=False", f"{A}.use_kl_loss"),
        ("algorithm.use_kl_in_reward=True", "algorithm.use_kl_in_reward"),
        ("trainer.balance_batch=True", "trainer.balance_batch"),
        (f"{A}.recompute_old_log_prob=True", f"{A}.recompute_old_log_prob"),
        ("overlay.fused_actor_rollout_ref=False", "overlay.fused_actor_rollout_ref"),
        ("reward_model.enable=True", "reward_model.enable"),
    ],
)
def test_d2d_refuses_what_needs_tensors_on_the_driver(override: str, key: str) -> None:
    cfg = composed("a3_256die_true_weight", override)
    assert check_config(cfg, environ={"D2D_DATA_TRANSFER": "0"}) == []
    problems = check_config(cfg, environ=D2D_ON)
    assert len(problems) == 1 and key in problems[0] and "D2D_DATA_TRANSFER" in problems[0], problems


def test_d2d_refuses_a_critic_estimator() -> None:
    cfg = composed("a3_256die_true_weight", "algorithm.adv_estimator=gae", f"{A}.recompute_old_log_prob=True")
    problems = check_config(cfg, environ=D2D_ON)
    assert any("algorithm.adv_estimator" in p and "D2D_DATA_TRANSFER" in p for p in problems)


@pytest.mark.parametrize("value, on", [("1", True), ("0", False), ("", False), ("off", False), ("true", True)])
def test_d2d_flag_reading(value: str, on: bool) -> None:
    from verl_patches.driver.step_plan import d2d_enabled, plan_steps

    assert d2d_enabled({"D2D_DATA_TRANSFER": value}) is on
    assert d2d_enabled({}) is False
    plan = plan_steps(composed("a3_256die_true_weight"), {"D2D_DATA_TRANSFER": value})
    assert plan.d2d is on and plan.skip_old_log_prob and plan.fused_role


def test_the_a3_profiles_pass_with_d2d() -> None:
    for profile in PROD_PROFILES:
        assert check_config(composed(profile), environ=D2D_ON) == []
