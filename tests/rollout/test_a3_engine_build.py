"""The rollout engine A3 builds, built and run on CPU (issues 24 and 31, vendor items F1, F2, F6).

verl's own vLLMRollout, with the resolved a3_256die_true_weight rollout config (sizes scaled down through the
same Hydra composition: 2 ranks, rollout TP1 x VLLM_DP_SIZE 2, so expert parallelism at DP > 1), and verl's
`LLM` bound to our `emulated_npu.build_llm` as the lifecycle patch binds it on a CPU host: our F1 __init__, F2's
VLLM_DP_* export, `OverlayLLM` -> vLLM's EngineArgs -> create_engine_config with vllm-ascend's
NPUPlatform.check_and_update_config and its parsing of additional_config, the V1 engine core, vllm-ascend's
NPUWorker and NPUModelRunner (distributed groups over an `hccl` backend carried by gloo, "npu" tensors from the
emulated device) with CustomDeepseekV3ForCausalLM compiled in TorchAir graph mode, all run for real. Before
that, on the same ranks, wrong values are refused by the upstream code that refuses them on A3.

The built engine then takes the model directory's weights through our lifecycle and decodes greedily; the
same tokens scored by transformers' DeepseekV3 (float32, same weights) give the same log-probs. Two sizes
differ from A3 and say why: the rollout dtype is float32 (the CPU-only V1 fp32 patch; A3 runs bf16), and
the KV cache has a fixed block count (the emulated device's memory is host memory).

Found by this test and fixed in engine_factory: verl v0.4.0 hands vLLM 0.9.1 `limit_mm_per_prompt=None` and
`disable_mm_preprocessor_cache=True`, both refused by vLLM's ModelConfig for DeepSeek-V3 on every rank."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from verl_patches.base.free_port import free_port, free_port_block
from verl_patches.launch.job_env import rollout_engine_environment
from verl_patches.multirank import run_rank_scripts
from verl_patches.sources import dist_info

REPO = Path(__file__).resolve().parents[2]
R = "actor_rollout_ref.rollout"
GRAPH = f"{R}.engine_kwargs.vllm.additional_config.torchair_graph_config"
SCALED = (
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    f"{R}.n=4",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=2",
    f"{R}.tensor_model_parallel_size=1",
    "data.max_prompt_length=48",
    "data.max_response_length=16",
    f"{R}.max_num_batched_tokens=32",
)
# Wrong values, each refused on A3 by vLLM's or vllm-ascend's own code (our trainer entry refuses them earlier)
WRONG = {
    "eager_with_graph_mode": (
        {"enforce_eager": True},
        "RuntimeError",
        "vllm_ascend/ascend_config.py",
        "Can't enable graph mode and eager mode",
    ),
    "graph_option_with_graph_off": (
        {
            "engine_kwargs": {
                "vllm": {"additional_config": {"torchair_graph_config": {"enabled": False, "graph_batch_sizes": []}}}
            },
            "enforce_eager": True,
        },
        "RuntimeError",
        "vllm_ascend/ascend_config.py",
        "enable_multistream_mla is valid only when Torchair",
    ),
    "no_chunked_prefill_below_max_model_len": (
        {
            "enable_chunked_prefill": False,
            "engine_kwargs": {
                "vllm": {
                    "additional_config": {"ascend_scheduler_config": {"enabled": True, "enable_chunked_prefill": False}}
                }
            },
        },
        "ValidationError",
        "",
        "max_num_batched_tokens (32) is smaller than max_model_len (64)",
    ),
}


@pytest.fixture(scope="module")
def tiny_hf_config(ranks) -> dict:
    return ranks[0]["model_config"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    from verl_patches.cpu_proof.tiny_a3 import tiny_spec
    from verl_patches.cpu_proof.tiny_assets import prepare
    from verl_patches.trainer.config_compose import compose_config, resolved

    if not Path(dist_info.path_entry(REPO), "vllm-0.9.1.dist-info").is_dir():
        from verl_patches.sources.lock import load_lock

        dist_info.generate(REPO, load_lock(REPO / "sources.lock"), ["vllm", "vllm_ascend"])
    saved = {k: os.environ.pop(k) for k in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH") if k in os.environ}
    try:
        cfg = resolved(compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", *SCALED]))
    finally:
        os.environ.update(saved)
    tmp = tmp_path_factory.mktemp("a3-engine")
    # the tiny run's model: a DeepSeek-V3 config with yarn, and a tokenizer (vLLM loads it)
    assets = prepare(tmp / "assets", tiny_spec(resolved(compose_config("ppo_tiny_local", []))), progress=False)
    cases = {name: case for name, (case, *_rest) in WRONG.items()}
    # last: it builds vLLM's distributed groups. fp32 to compare with transformers; KV blocks fixed (host memory)
    cases["a3"] = {"dtype": "float32", "engine_kwargs": {"vllm": {"num_gpu_blocks_override": 16}}}
    spec = tmp / "spec.json"
    spec.write_text(
        json.dumps(
            {
                "model_dir": str(assets.model_dir),
                "rollout": OmegaConf.to_container(cfg.actor_rollout_ref.rollout),
                "cases": cases,
            }
        )
    )
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("VLLM_", "HCCL_"))}
    env.update(rollout_engine_environment())  # as the A3 job and the tiny run export them
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO), dist_info.path_entry(REPO)]),
        VLLM_DP_SIZE="2",
        HCCL_SOCKET_IFNAME="lo",
        ASCEND_RT_VISIBLE_DEVICES="0,1",
        # F2's DP master ports, as the tiny launch hands them out: one group (TP1), base + 1
        VERL_PATCHES_VLLM_DP_BASE_PORT=str(free_port_block(1) - 1),
    )  # vLLM's worker takes npu:LOCAL_RANK; MASTER_PORT (vLLM's) comes with RANK from the harness
    rendezvous = str(free_port())  # the probe's own gloo group
    outs = [tmp / f"rank{r}.json" for r in range(2)]
    run_rank_scripts(
        Path(__file__).with_name("a3_engine_probe.py"),
        2,
        900,
        args=lambda r: [str(spec), str(r), "2", rendezvous, str(outs[r])],
        rank_env=[env, env],
        cwd=REPO,
    )
    return [json.loads(out.read_text()) for out in outs]


@pytest.mark.slow
def test_the_a3_rollout_is_vllm_ascends_engine_compiled_for_torchair(ranks, tiny_hf_config) -> None:
    from verl_patches.launch.preflight.memory_estimate import rollout_parameter_tensors
    from verl_patches.reshard.model_dims import ModelDims

    parameter_tensors = rollout_parameter_tensors(ModelDims.from_hf_config(tiny_hf_config))
    for rank, out in enumerate(ranks):
        # the A3 engine on the emulated npu device: the lifecycle patch's CPU twin
        assert out["cpu_binding"] == "verl_patches.patches.verl.workers.rollout.emulated_npu.build_llm"
        a3 = out["cases"]["a3"]
        assert a3["stopped_at"] is None, a3["stopped_at"]
        assert a3["built"] == {
            "worker": "vllm_ascend.worker.worker_v1.NPUWorker",
            "model_runner": "vllm_ascend.worker.model_runner_v1.NPUModelRunner",
            "model": "vllm_ascend.models.deepseek_v2.CustomDeepseekV3ForCausalLM",
            "attention_impls": ["vllm_ascend.attention.mla_v1.AscendMLAImpl"],
            "moe": ["vllm_ascend.ops.fused_moe.AscendFusedMoE"],
            "sampler": "vllm.v1.sample.sampler.Sampler",  # vllm-ascend 0.9.1 keeps vLLM's, with its top-k/top-p
            "top_k_top_p": "vllm_ascend.patch.worker.patch_common.patch_sampler",
            "torchair_graph_enabled": True,
            "graphs_compiled": True,
            "device": f"npu:{rank}",
            "dtype": "float32",
            "parameter_tensors": parameter_tensors,  # the preflight's count (memory_estimate), on the built model
            "groups": {"tp": 1, "dp": 2, "ep": 2},  # vLLM's groups: experts over DP x TP
        }, a3["built"]
        base = a3["dp_env"]["VERL_PATCHES_VLLM_DP_BASE_PORT"]
        # F2: the one DP group's master port is the launch's base + 1, never verl's MASTER_PORT + 1
        assert a3["dp_env"] == {
            "VLLM_DP_SIZE": "2",
            "VLLM_DP_RANK": str(rank),
            "VLLM_DP_MASTER_PORT": str(int(base) + 1),
            "VERL_PATCHES_VLLM_DP_BASE_PORT": base,
        }
        assert a3["groups"] == a3["built"]["groups"]


@pytest.mark.slow
def test_the_built_engine_decodes_what_transformers_computes(ranks) -> None:
    """Prefill (eager) and decode (the TorchAir graph) on the emulated kernels, experts split over EP2."""
    for out in ranks:
        decoded = out["cases"]["a3"]["decoded"]
        for seq in decoded["tokens"]:
            assert len(seq["vllm"]) == 4 and seq["vllm"] == seq["hf_greedy"], seq
        assert decoded["logprob_abs_diff_max"] < 1e-4, decoded
        print(f"vllm-ascend vs transformers, greedy log-probs: max |difference| {decoded['logprob_abs_diff_max']:.2e}")


@pytest.mark.slow
def test_decode_takes_vllm_ascends_a3_mc2_branch(ranks, tiny_hf_config) -> None:
    """vllm-ascend calls the MC2 v2 pair when torch_npu has it (as the real 2.5.1.post1 wheel does): the generate
    ran npu_moe_distribute_dispatch_v2 / combine_v2, once per MoE layer and decode step, and never the v1 pair."""
    moe_layers = tiny_hf_config["num_hidden_layers"] - tiny_hf_config.get("first_k_dense_replace", 0)
    for rank, out in enumerate(ranks):
        calls = out["cases"]["a3"]["decoded"]["mc2_calls"]
        dispatched = calls.get("npu_moe_distribute_dispatch_v2", 0)
        assert dispatched > 0 and dispatched % moe_layers == 0, (rank, calls)
        assert calls.get("npu_moe_distribute_combine_v2") == dispatched, (rank, calls)
        assert set(calls) == {"npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2"}, (rank, calls)
        print(f"rank {rank}: MC2 calls during generate {calls} ({moe_layers} MoE layers)")


@pytest.mark.slow
def test_what_the_engine_receives(ranks) -> None:
    for rank, out in enumerate(ranks):
        args, engine = out["cases"]["a3"]["engine_args"], out["cases"]["a3"]["engine"]
        assert args["enable_sleep_mode"] is False and args["enable_prefix_caching"] is False
        assert args["enable_expert_parallel"] is True and args["distributed_executor_backend"] == "external_launcher"
        assert (args["max_num_seqs"], args["max_num_batched_tokens"], args["max_model_len"]) == (8, 32, 64)
        # graph mode on, one graph of max_num_seqs = train_batch_size 4 x n 4 / rollout DP 2
        assert engine["ascend_graph"] == {
            "enabled": True,
            "graph_batch_sizes": [8],
            "enable_multistream_mla": True,
            "enable_multistream_moe": True,
            "enable_kv_nz": False,
            "enable_view_optimize": False,
            "use_cached_graph": False,
        }
        assert engine["enforce_eager"] is False and engine["compilation_level"] == 0  # TorchAir, not ACL graph
        assert engine["enable_sleep_mode"] is False and engine["prefix_caching"] is False
        assert engine["expert_parallel"] is True
        assert (engine["data_parallel_size"], engine["data_parallel_rank"], engine["tensor_parallel_size"]) == (
            2,
            rank,
            1,
        )
        # chunked prefill as configured, in vLLM's scheduler: vllm-ascend's would return vLLM's schedule anyway
        # with chunked prefill on, so the profile does not enable it (rollout_settings refuses enabled=True)
        assert engine["platform_config_class"] == "vllm.config.SchedulerConfig"
        assert engine["ascend_scheduler"] == {"enabled": False, "enable_chunked_prefill": True}
        assert engine["scheduler"]["chunked_prefill_enabled"] is True
        assert (engine["scheduler"]["max_num_batched_tokens"], engine["scheduler"]["max_num_seqs"]) == (32, 8)
        assert engine["worker_cls"] == "vllm_ascend.worker.worker_v1.NPUWorker"


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(WRONG))
def test_a_wrong_value_is_refused_by_the_code_that_refuses_it_on_a3(ranks, case: str) -> None:
    _, error, file, text = WRONG[case]
    for out in ranks:
        stop = out["cases"][case]["stopped_at"]
        assert stop["error"] == error and text in stop["message"], stop
        if file:
            assert stop["file"] == file, stop
        assert "engine" not in out["cases"][case]  # refused while the engine config was made


def test_trainer_entry_refuses_the_same_wrong_values_first() -> None:
    """The same values never reach the cluster: the trainer entry's rules (rollout_settings) name them."""
    from verl_patches.driver.rollout_settings import rollout_problems
    from verl_patches.trainer.config_compose import compose_config, resolved

    saved = {k: os.environ.pop(k) for k in ("MODEL_PATH", "DATA_DIR", "DIST_CKPT_PATH") if k in os.environ}
    try:
        a3 = resolved(compose_config("ppo_mindspeed_trainer", ["profile=a3_256die_true_weight", *SCALED]))
    finally:
        os.environ.update(saved)
    assert rollout_problems(a3) == []
    for case, *_ in WRONG.values():
        wrong = OmegaConf.merge(a3, {"actor_rollout_ref": {"rollout": case}})
        assert rollout_problems(wrong), case
