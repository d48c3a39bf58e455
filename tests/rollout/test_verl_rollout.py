"""verl v0.4.0's own vLLMRollout on a CPU host through our declared patches, plus the A3 engine arguments (pure).

The probe opts into the test-only stand-in (`VERL_PATCHES_ROLLOUT_STANDIN=1`): what it checks is verl's side of
the seam (the patch binding `LLM`, verl's `sleep(level=1)` freeing KV and offloading, the lifecycle driving a
weight load and KV init, verl's generate_sequences on a DataProto) in seconds. Without the switch the same
binding builds vllm-ascend's engine (tests/rollout/test_a3_engine_build.py, and the tiny run)."""

from __future__ import annotations

import pytest

from probe_runner import run_probe
from verl_patches.patches.verl.workers.rollout.declarations import PATCHES
from verl_patches.patching.fingerprint import fingerprint_target
from verl_patches.rollout.engine_factory import rollout_llm_kwargs


@pytest.mark.slow
def test_verl_vllm_rollout_runs_on_the_cpu_standin(tiny_model_dir) -> None:
    out = run_probe("verl_rollout_probe.py", tiny_model_dir, VERL_PATCHES_ROLLOUT_STANDIN="1")
    assert out["llm_class"] == "verl_patches.rollout.standin.engine.StandinLLM"
    assert out["LLM_name_in_verl"] == "verl_patches.rollout.engine_factory.build_standin_llm"
    assert out["engine_sleep_mode"] is False  # the A3 engine arguments (rollout_llm_kwargs) reach the stand-in
    assert out["applied"] == [
        "cpu.verl.vllm_rollout_spmd.LLM.lifecycle",
        "cpu.verl.vllm_rollout_spmd.LLM.standin",  # the switch's layer, over the lifecycle binding
        "verl.vllm_rollout_spmd.vLLMRollout.__init__.a3_checks",
        "verl.vllm_rollout_spmd.vLLMRollout.__init__.dp_env_and_compile",
        "verl.vllm_rollout_spmd.vLLMRollout.generate_sequences.real_compile",
    ]
    assert out["loaded"] > 0 and out["rollout_log_probs_finite"] is True
    assert out["engine_max_num_seqs"] == 8  # engine_kwargs.vllm reaches the engine
    assert out["responses_shape"] == [4, 5] and out["input_ids_shape"] == [4, 11]  # 2 prompts x n=2
    assert out["bytes_after_build"] == out["bytes_after_sleep"]  # verl's sleep(level=1): back to baseline


def _a3_engine_kwargs() -> dict:
    """What verl's vLLMRollout hands `LLM` with the resolved A3 profile: its own arguments plus the profile's
    engine_kwargs.vllm (max_num_seqs, vllm-ascend's additional_config)."""
    from omegaconf import OmegaConf

    from verl_patches.trainer.config_compose import compose_config, resolved

    rollout = resolved(
        compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight"])
    ).actor_rollout_ref.rollout
    return {
        "model": "/m",
        "enable_sleep_mode": True,
        "enable_prefix_caching": True,
        "tensor_parallel_size": 2,
        "distributed_executor_backend": "external_launcher",
        "enforce_eager": rollout.enforce_eager,
        "enable_chunked_prefill": rollout.enable_chunked_prefill,
        **OmegaConf.to_container(rollout.engine_kwargs.vllm),
    }


def test_a3_engine_arguments() -> None:
    verl_kwargs = _a3_engine_kwargs()
    kw = rollout_llm_kwargs(verl_kwargs, {"VLLM_DP_SIZE": "64"})
    assert kw["enable_sleep_mode"] is False and kw["enable_prefix_caching"] is False
    assert kw["enable_expert_parallel"] is True and kw["max_num_seqs"] == 64
    graph = kw["additional_config"]["torchair_graph_config"]
    assert graph["enabled"] is True and graph["graph_batch_sizes"] == [64] and graph["enable_kv_nz"] is False
    assert graph["enable_multistream_mla"] is True and graph["enable_multistream_moe"] is True
    # chunked prefill on: vllm-ascend's scheduler would return vLLM's schedule, so the profile does not enable it
    assert kw["additional_config"]["ascend_scheduler_config"] == {"enabled": False, "enable_chunked_prefill": True}
    assert kw["additional_config"]["refresh"] is True
    assert {k: kw[k] for k in ("model", "tensor_parallel_size", "distributed_executor_backend")} == {
        "model": "/m",
        "tensor_parallel_size": 2,
        "distributed_executor_backend": "external_launcher",
    }
    single = rollout_llm_kwargs({"max_num_seqs": 8}, {"VLLM_ENABLE_GRAPH_MODE": "1"})  # the variable is not read
    assert "enable_expert_parallel" not in single and "torchair_graph_config" not in single["additional_config"]
    assert verl_kwargs["enable_sleep_mode"] is True  # the caller's dict is not modified
    # what verl v0.4.0 passes for text-only data and vLLM 0.9.1 refuses for DeepSeek-V3 (test_a3_engine_build)
    text_only = rollout_llm_kwargs({"limit_mm_per_prompt": None, "disable_mm_preprocessor_cache": True}, {})
    assert "limit_mm_per_prompt" not in text_only and text_only["disable_mm_preprocessor_cache"] is False
    assert rollout_llm_kwargs({"limit_mm_per_prompt": {"image": 2}}, {})["limit_mm_per_prompt"] == {"image": 2}


@pytest.mark.parametrize(
    "change, key",
    [
        ({"max_num_seqs": 32}, "graph_batch_sizes"),
        ({"enable_chunked_prefill": False}, "ascend_scheduler_config.enable_chunked_prefill"),
    ],
)
def test_engine_arguments_that_contradict_each_other_are_refused(change: dict, key: str) -> None:
    from verl_patches.rollout.engine_factory import EngineArgumentError

    kwargs = _a3_engine_kwargs()
    kwargs["additional_config"]["ascend_scheduler_config"]["enabled"] = True  # where its own value is read
    with pytest.raises(EngineArgumentError, match=key.replace(".", r"\.")):
        rollout_llm_kwargs({**kwargs, **change}, {})


def test_declarations_are_pinned_and_the_standin_is_cpu_only() -> None:
    by_name = {p.name: p for p in PATCHES}
    assert by_name["cpu.verl.vllm_rollout_spmd.LLM.standin"].devices == ("cpu",)
    assert by_name["cpu.verl.vllm_rollout_spmd.LLM.standin"].env_flag == "VERL_PATCHES_ROLLOUT_STANDIN"  # opt-in
    assert by_name["verl.vllm_rollout_spmd.LLM.lifecycle"].devices == ("npu",)
    assert by_name["cpu.verl.vllm_rollout_spmd.LLM.lifecycle"].devices == ("cpu",)  # on the emulated npu device
    for p in PATCHES:
        assert fingerprint_target(*p.fingerprint_targets) == p.fingerprint, p.name
        if p.kind.value == "wrap" and not p.name.endswith(".a3_checks"):  # that one needs upstream's source:
            assert callable(p.replacement(lambda *a, **k: None))  # test_rollout_init_checks


def test_rollout_runs_under_the_real_torch_compile_while_mindspeeds_substitute_is_set(monkeypatch) -> None:
    """F1: MindSpeed-LLM sets torch.compile = torch.jit.script process-wide; verl's rollout construction
    and generate_sequences must see the real torch.compile, and training code the substitute again."""
    import torch

    from verl_patches import compile_toggle
    from verl_patches.rollout.verl_hooks import wrap_generate_sequences, wrap_rollout_init

    real = compile_toggle.capture_real_compile()
    monkeypatch.setattr(torch, "compile", torch.jit.script)  # what MindSpeed-LLM's adaptor does
    seen = []

    class Engine:  # an engine without a model runner (as the rollout stand-in): no graph-decode counts
        def generate(self, prompts, sampling_params=None):
            return prompts

    class Rollout:
        def __init__(self, model_path, config, *args, **kwargs):
            seen.append(("init", torch.compile))
            self.inference_engine = Engine()

        def generate_sequences(self, prompts):
            seen.append(("generate", torch.compile))
            return self.inference_engine.generate(prompts)

    Rollout.__init__ = wrap_rollout_init(Rollout.__init__)
    Rollout.generate_sequences = wrap_generate_sequences(Rollout.generate_sequences)
    r = Rollout("/m", {"tensor_model_parallel_size": 1})
    assert r.generate_sequences("batch") == "batch"
    assert seen == [("init", real), ("generate", real)]
    assert torch.compile is torch.jit.script  # training keeps MindSpeed's substitute
