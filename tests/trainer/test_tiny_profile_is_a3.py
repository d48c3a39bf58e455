"""The tiny profile is the A3 profile with small numbers (DESIGN §6).

Both configs are composed and resolved through Hydra exactly as the trainer entry does; every leaf that
differs must be on the allow-list below, each entry with the reason it may differ. A setting the tiny run
does not carry is a setting the CPU proof does not prove: on 2026-11-24 the A3 profile's
``enforce_eager: False`` + ``free_cache_engine: True`` and chunked prefill below ``max_model_len`` stopped
verl's vLLMRollout on every rank, and no test saw it because the tiny profile used verl's defaults."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from omegaconf import OmegaConf

from verl_patches.trainer.config_compose import compose_config, resolved

A3 = "a3_256die_true_weight"
R = "actor_rollout_ref.rollout"

# Keys the tiny run may set differently from the A3 profile (fnmatch patterns over dotted leaf keys).
ALLOWED: dict[str, str] = {
    # sizes of the model, batches and sequences
    "data.train_batch_size": "batch size",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "batch size (= train_batch_size as on A3)",
    "critic.ppo_mini_batch_size": "verl interpolates it from the actor's",
    "*.ppo_micro_batch_size_per_gpu": "batch size",
    "*.log_prob_micro_batch_size_per_gpu": "batch size",
    "data.max_prompt_length": "length",
    "data.max_response_length": "length (a worked answer in think tags, its boxed answer and EOS: 9 of 12)",
    f"{R}.prompt_length": "length (verl interpolates data.max_prompt_length)",
    f"{R}.response_length": "length (verl interpolates data.max_response_length)",
    f"{R}.max_model_len": "length: A3's 4096, above max_num_batched_tokens as on A3",
    f"{R}.max_num_seqs": "batch size, derived as on A3: train_batch_size x n / rollout DP (16 x 16 / 2)",
    f"{R}.engine_kwargs.vllm.max_num_seqs": "batch size (the same value, passed to the engine as on A3)",
    f"{R}.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes": "batch size (the graph's "
    "batch is max_num_seqs as on A3)",
    f"{R}.max_num_batched_tokens": "length: below max_model_len as on A3, >= max_num_seqs as vLLM requires; an "
    "engine's prompts prefill in two chunked steps",
    # parallel sizes and the layer split
    "*.tensor_model_parallel_size": "parallel size",
    "*.pipeline_model_parallel_size": "parallel size",
    "*.expert_model_parallel_size": "parallel size",
    "actor_rollout_ref.actor.megatron.pipeline_parallel_num_layer_list": "layers (PP1)",
    "overlay.vllm_dp_size": "parallel size (one rollout instance of DP2 x TP2: EP4 over the four ranks)",
    f"{R}.engine_kwargs.vllm.num_gpu_blocks_override": "host resources (the emulated npu device's memory is host "
    "memory: vLLM would size the KV cache from the host's free gigabytes)",
    # dtype and device
    "*.params_dtype": "dtype: fp32 so rollout and training log-probs agree to 1e-3",
    "actor_rollout_ref.actor.megatron.swap_optimizer": "follows the dtype: MindSpeed's swap optimizer has no Adam "
    "state for fp32 parameters (refused by config_checks)",
    f"{R}.dtype": "dtype",
    "trainer.device": "device (the host's)",
    "overlay.dies_per_card": "device (a CPU rank is one 'die')",
    "trainer.nnodes": "node count",
    "trainer.n_gpus_per_node": "ranks per node",
    "ray_init.num_cpus": "host resources (the local Ray cluster's CPUs)",
    "data.dataloader_num_workers": "host resources (worker processes only cost time on 2 cores)",
    # paths, names and the tiny run's own asset keys
    "data.train_files": "path",
    "data.val_files": "path",
    "actor_rollout_ref.model.path": "path",
    "critic.model.tokenizer_path": "path (interpolated)",
    "reward_model.model.input_tokenizer": "path (interpolated)",
    "*.dist_checkpointing_path": "path (the tiny checkpoint, built on first use)",
    "trainer.project_name": "name",
    "trainer.experiment_name": "name",
    "trainer.default_local_dir": "path (A3: none, CKPT_DIR names it; tiny: verl's, from the names)",
    "overlay.profile": "name (`tiny` also makes the entry build the assets)",
    "overlay.tiny_*": "the tiny run's asset spec (absent on A3)",
    "data.seed": "the tiny run's one seed (data order, model init)",
    # step counts
    "trainer.total_epochs": "step count",
    "trainer.total_training_steps": "step count",
    "trainer.test_freq": "step count (validation every 20 steps)",
    "trainer.save_freq": "step count (the 60-step run saves no checkpoint; its kill-and-resume test turns saving on)",
    # the two settings tied to the model's scale and to its one-token answers
    "actor_rollout_ref.actor.optim.lr": "a 1.3 M-parameter model learns at 3e-4 (measured, tiny_base.py); 1e-6 "
    "moves it nowhere in 60 steps",
}

# What the tiny run must carry from the A3 profile (the issue's list): a test of the test.
MUST_CARRY = (
    f"{R}.enforce_eager",
    f"{R}.free_cache_engine",
    f"{R}.enable_chunked_prefill",
    f"{R}.engine_kwargs.vllm.additional_config.torchair_graph_config.enabled",
    f"{R}.engine_kwargs.vllm.additional_config.torchair_graph_config.enable_multistream_mla",
    f"{R}.engine_kwargs.vllm.additional_config.ascend_scheduler_config.enable_chunked_prefill",
    "actor_rollout_ref.actor.recompute_old_log_prob",
    "overlay.d2d_tensor_cache",
    "overlay.fused_actor_rollout_ref",
    "actor_rollout_ref.actor.use_kl_loss",
    "actor_rollout_ref.actor.kl_loss_coef",
    "actor_rollout_ref.actor.kl_loss_type",
    "algorithm.use_kl_in_reward",
    "algorithm.kl_ctrl.kl_coef",
    f"{R}.temperature",
    f"{R}.top_k",
    f"{R}.top_p",
    f"{R}.n",
    f"{R}.ignore_eos",
    "algorithm.adv_estimator",
)


def leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(leaves(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


@pytest.fixture(scope="module")
def both(monkeypatch_module) -> tuple[dict[str, Any], dict[str, Any]]:
    a3 = resolved(compose_config("ppo_mindspeed_trainer", [f"profile={A3}"]))
    tiny = resolved(compose_config("ppo_tiny_local", []))
    return leaves(OmegaConf.to_container(a3)), leaves(OmegaConf.to_container(tiny))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    for name in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH", "CKPT_DIR"):  # the A3 profile reads them
        mp.delenv(name, raising=False)
    yield mp
    mp.undo()


def allowed(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in ALLOWED)


def test_tiny_differs_from_a3_only_in_allowed_keys(both) -> None:
    a3, tiny = both
    missing = object()
    differing = sorted(k for k in a3.keys() | tiny.keys() if a3.get(k, missing) != tiny.get(k, missing))
    assert differing, "the tiny run has small numbers: something must differ"
    not_allowed = [
        f"{k}: A3 {a3.get(k, '<absent>')!r}, tiny {tiny.get(k, '<absent>')!r}" for k in differing if not allowed(k)
    ]
    assert not not_allowed, "the tiny profile changes A3 settings that are not sizes:\n" + "\n".join(not_allowed)


def test_the_settings_the_issue_names_are_carried(both) -> None:
    a3, tiny = both
    for key in MUST_CARRY:
        assert key in a3, f"{key} is not in the A3 profile"
        assert not allowed(key), f"{key} must not be on the allow-list"
        assert tiny[key] == a3[key], key
    # and the values that made verl's rollout stop on A3 are really there
    assert (tiny[f"{R}.enforce_eager"], tiny[f"{R}.free_cache_engine"], tiny[f"{R}.enable_chunked_prefill"]) == (
        False,
        True,
        True,
    )
    assert tiny[f"{R}.max_num_batched_tokens"] < tiny[f"{R}.max_model_len"]


def test_max_num_seqs_is_the_per_engine_share_in_both(both) -> None:
    for cfg in both:
        world = cfg["trainer.nnodes"] * cfg["trainer.n_gpus_per_node"]
        share = cfg["data.train_batch_size"] * cfg[f"{R}.n"] // (world // cfg[f"{R}.tensor_model_parallel_size"])
        assert cfg[f"{R}.engine_kwargs.vllm.max_num_seqs"] == cfg[f"{R}.max_num_seqs"] == share
        assert cfg[f"{R}.engine_kwargs.vllm.additional_config.torchair_graph_config.graph_batch_sizes"] == [share]


def test_an_a3_setting_changed_in_the_tiny_file_is_caught(both) -> None:
    """The diff is not vacuous: a non-size key overridden on the tiny side shows up as not allowed."""
    a3, _ = both
    tiny = leaves(OmegaConf.to_container(resolved(compose_config("ppo_tiny_local", [f"{R}.temperature=1.0"]))))
    assert tiny[f"{R}.temperature"] != a3[f"{R}.temperature"] and not allowed(f"{R}.temperature")


def test_every_allow_list_entry_is_used(both) -> None:
    """A stale entry would let a future change slip through silently."""
    a3, tiny = both
    missing = object()
    differing = [k for k in a3.keys() | tiny.keys() if a3.get(k, missing) != tiny.get(k, missing)]
    unused = [p for p in ALLOWED if not any(fnmatch.fnmatchcase(k, p) for k in differing)]
    assert not unused, f"allow-list entries that match no difference: {unused}"
