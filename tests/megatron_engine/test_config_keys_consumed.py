"""Every key our trainer config and A3 profiles add beyond verl's own ppo_megatron_trainer.yaml is read by
some code: a key read by nothing is a setting that silently does nothing on the cluster.

Each added key must appear in CONSUMERS with the file that reads it and the exact text that reads it; the
test fails for an added key without an entry, for an entry whose text is no longer in that file, and for an
entry whose key no config adds any more. Behaviour tests of the recipe-specific keys are named next to them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_patches.trainer.config_compose import VERL_CONFIG_DIR, compose_config

REPO = Path(__file__).resolve().parents[2]
PROFILES = sorted(p.stem for p in (REPO / "verl_patches/trainer/config/profile").glob("*.yaml"))
A = "actor_rollout_ref.actor"
ACTOR_PY = "verl_patches/patches/verl/workers/actor/megatron_actor.py"
TRANSLATE_PY = "verl_patches/train_engine/translate.py"
VLLM_ROLLOUT_PY = "verl/workers/rollout/vllm_rollout/vllm_rollout_spmd.py"
ASCEND_CONFIG_PY = "vllm_ascend/ascend_config.py"
ENGINE = "actor_rollout_ref.rollout.engine_kwargs.vllm"
TORCHAIR = f"{ENGINE}.additional_config.torchair_graph_config"
SCHEDULER = f"{ENGINE}.additional_config.ascend_scheduler_config"
A3_BUILD = "tests/rollout/test_a3_engine_build.py"

# key -> (file, text that reads it[, behaviour test])
CONSUMERS: dict[str, tuple[str, str, str]] = {
    f"{A}.recompute_old_log_prob": (
        ACTOR_PY,
        'get("recompute_old_log_prob", True)',
        "test_actor_loss::test_recompute_old_log_prob_false_is_reinforce_with_ratio_one",
    ),
    f"{A}.use_packed_seq": (
        ACTOR_PY,
        'get("use_packed_seq", False)',
        "test_actor_loss::test_packed_sequences_are_refused_with_the_key_to_change",
    ),
    f"{A}.max_packing_token_size": (ACTOR_PY, 'get("max_packing_token_size", None)', ""),
    "actor_rollout_ref.ref.use_packed_seq": (ACTOR_PY, 'get("use_packed_seq", False)', ""),
    "actor_rollout_ref.ref.max_packing_token_size": (ACTOR_PY, 'get("max_packing_token_size", None)', ""),
    "actor_rollout_ref.ref.use_dynamic_bsz": (ACTOR_PY, 'self.config.get("use_dynamic_bsz", False)', ""),
    f"{A}.megatron.pipeline_parallel_num_layer_list": (
        TRANSLATE_PY,
        "pipeline_parallel_num_layer_list",
        "test_engine_golden::test_golden_pp2_uneven_layer_list",
    ),
    f"{A}.megatron.swap_optimizer": (
        TRANSLATE_PY,
        "swap_optimizer",
        "tests/train_engine/test_engine_multiproc.py (swap_optimizer=True run)",
    ),
    f"{A}.megatron.fix_router": (
        TRANSLATE_PY,
        "fix_router",
        "tests/train_engine/test_engine_multiproc.py::test_tp2_sequence_parallel_tp_extend_ep_with_fix_router",
    ),
    "actor_rollout_ref.rollout.trust_remote_code": (
        "verl_patches/patches/verl/workers/megatron_workers.py",
        'self.config.rollout.get("trust_remote_code", False)',
        "",
    ),
    f"{A}.rollout_correction.tis_cap": (
        "verl_patches/worker_calls/rollout_correction.py",
        'CAP_KEY = "actor_rollout_ref.actor.rollout_correction.tis_cap"',
        "test_actor_loss::test_tis_in_the_actors_update_is_an_identity_on_agreement_and_the_formula_on_a_perturbed_"
        "rollout, test_rollout_correction.py",
    ),
    **{
        f"overlay.rollout_mismatch_gate.{level}.{metric}": (
            "verl_patches/driver/mismatch_gate.py",
            "overlay_settings(cfg).rollout_mismatch_gate",
            "tests/driver/test_mismatch_gate.py",
        )
        for level in ("warn", "stop")
        for metric in ("logprob_abs_diff_mean", "ratio_abs_dev_mean", "logprob_abs_diff_max")
    },
    "overlay.profile": ("verl_patches/trainer/main_ppo_npu.py", 'overlay.profile == "tiny"', ""),
    "overlay.dies_per_card": ("verl_patches/trainer/main_ppo_npu.py", "str(overlay.dies_per_card)", ""),
    "overlay.vllm_dp_size": (
        "verl_patches/base/job_layout.py",
        "overlay_settings(cfg).vllm_dp_size",
        "tests/trainer/test_profiles.py",
    ),
    "overlay.fused_actor_rollout_ref": (
        "verl_patches/driver/step_plan.py",
        "overlay_settings(cfg).fused_actor_rollout_ref",
        "",
    ),
    "overlay.d2d_tensor_cache": (
        "verl_patches/driver/step_plan.py",
        "overlay_settings(cfg).d2d_tensor_cache",
        "tests/driver/test_d2d_switch.py, tests/patches/test_d2d_worker_cache.py",
    ),
    "custom_reward_function.reward_kwargs.format_rule": ("verl_patches/reward/deepscaler.py", "format_rule", ""),
    "overlay.val_max_prompts": (
        "verl_patches/patches/verl/trainer/val_subset.py",
        "overlay_settings(self.config).val_max_prompts",
        "tests/patches/test_val_subset.py::test_verls_dataloader_validates_on_the_subset",
    ),
    "overlay.async_checkpoint": (
        "verl_patches/checkpoint/trainer_io.py",
        "overlay_settings(cfg).async_checkpoint",
        "tests/checkpoint/test_background_commit.py, tests/checkpoint/test_background_save_resume.py",
    ),
    # vLLM's LLM keyword arguments: verl's vLLMRollout passes engine_kwargs.vllm through unchanged
    f"{ENGINE}.max_num_seqs": (VLLM_ROLLOUT_PY, "**engine_kwargs,", f"{A3_BUILD}::test_what_the_engine_receives"),
    # vllm-ascend's own settings, read from LLM(additional_config=...)
    **{
        f"{TORCHAIR}.{k}": (ASCEND_CONFIG_PY, f'"{k}"', f"{A3_BUILD}::test_what_the_engine_receives")
        for k in (
            "enabled",
            "use_cached_graph",
            "graph_batch_sizes_init",
            "graph_batch_sizes",
            "enable_multistream_mla",
            "enable_multistream_moe",
            "enable_view_optimize",
            "enable_kv_nz",
        )
    },
    f"{SCHEDULER}.enabled": (
        ASCEND_CONFIG_PY,
        'ascend_scheduler_config.get("enabled", False)',
        f"{A3_BUILD}::test_what_the_engine_receives",
    ),
    # AscendSchedulerConfig copies every key it is given, then the scheduler reads it as a dataclass field
    f"{SCHEDULER}.enable_chunked_prefill": (
        "vllm_ascend/core/schedule_config.py",
        "self.chunked_prefill_enabled = self.enable_chunked_prefill",
        "tests/driver/test_rollout_settings.py",
    ),
}


def leaves(node, prefix: str = "") -> set[str]:
    if isinstance(node, dict):
        out: set[str] = set()
        for k, v in node.items():
            if k == "defaults" and not prefix:
                continue
            out |= leaves(v, f"{prefix}{k}.")
        return out
    return {prefix[:-1]}


@pytest.fixture(scope="module")
def added_keys() -> set[str]:
    verl = leaves(OmegaConf.to_container(OmegaConf.load(Path(VERL_CONFIG_DIR) / "ppo_megatron_trainer.yaml")))
    ours: set[str] = set()
    for overrides in [[]] + [[f"profile={p}"] for p in PROFILES]:
        cfg = compose_config("ppo_mindspeed_trainer", overrides)
        ours |= leaves(OmegaConf.to_container(cfg, resolve=False))
    # a key verl has as an empty mapping ({}) and a profile fills in is verl's own
    return {k for k in ours - verl if not any(k.startswith(v + ".") for v in verl)}


def test_every_added_key_has_a_consumer(added_keys: set[str]) -> None:
    missing = sorted(added_keys - set(CONSUMERS))
    assert not missing, f"keys our configs add that nothing is known to read: {missing}"


@pytest.mark.parametrize("key", sorted(CONSUMERS))
def test_consumer_still_reads_the_key(key: str, added_keys: set[str]) -> None:
    assert key in added_keys, f"{key} is no longer added by our configs: drop its CONSUMERS entry"
    path, text, _ = CONSUMERS[key]
    source = (REPO / path).read_text(encoding="utf-8") if (REPO / path).is_file() else ""
    assert text in source, f"{key}: {path} does not read it any more (looked for {text!r})"
