"""One rank (argv: spec JSON, rank, world size, rendezvous port, result JSON) of verl's vLLMRollout built with the A3
engine on a CPU host: our prelude, then verl's `LLM` name bound to `emulated_npu.build_llm` exactly as the lifecycle
patch binds it on a CPU host (not the CPU stand-in), so vLLM's EngineArgs -> create_engine_config, vllm-ascend's
NPUPlatform.check_and_update_config and ascend_config, the V1 engine core and vllm-ascend's worker run for real on
the torch_npu emulation. For each case of the spec it records where construction stopped and what the engine
received. The last case ("a3") builds the whole engine; the probe then names the classes that run (model runner,
model, attention and MoE implementations, sampler, graph mode), loads the model directory's weights through the
lifecycle as the weight sync does, decodes greedily with log-probs and scores the same tokens with transformers'
DeepseekV3 (float32, same weights). Results go to the result file."""

import json
import os
import sys
import traceback

import verl_patches.prelude_patch  # noqa: F401  (what every job process runs first)

# isort: split
import torch.distributed as dist  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

spec = json.load(open(sys.argv[1]))
rank, world, port = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

from transformers import AutoConfig, AutoTokenizer  # noqa: E402
from verl.workers.rollout.vllm_rollout import vllm_rollout_spmd  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402

from verl_patches.patches.verl.workers.rollout import emulated_npu  # noqa: E402
from verl_patches.rollout.engine_report import describe  # noqa: E402
from verl_patches.worker_calls.env_names import DP_BASE_PORT_ENV  # noqa: E402

out = {"cpu_binding": f"{vllm_rollout_spmd.LLM.__module__}.{vllm_rollout_spmd.LLM.__qualname__}", "cases": {}}
vllm_rollout_spmd.LLM = emulated_npu.build_llm  # the binding of cpu.verl.vllm_rollout_spmd.LLM.lifecycle

seen: dict = {}
_create = EngineArgs.create_engine_config


def create_engine_config(self, *args, **kwargs):
    seen["engine_args"] = {
        k: getattr(self, k)
        for k in (
            "enable_sleep_mode",
            "enable_prefix_caching",
            "enable_expert_parallel",
            "enforce_eager",
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "enable_chunked_prefill",
            "distributed_executor_backend",
        )
    }
    cfg = _create(self, *args, **kwargs)  # runs NPUPlatform.check_and_update_config
    seen["vllm_config"] = cfg
    return cfg


EngineArgs.create_engine_config = create_engine_config


def summary(cfg) -> dict:
    from vllm_ascend.ascend_config import get_ascend_config

    asc = get_ascend_config()
    graph = asc.torchair_graph_config
    return {
        "platform_config_class": type(cfg.scheduler_config).__module__ + "." + type(cfg.scheduler_config).__name__,
        "scheduler": {
            "chunked_prefill_enabled": cfg.scheduler_config.chunked_prefill_enabled,
            "max_num_batched_tokens": cfg.scheduler_config.max_num_batched_tokens,
            "max_num_seqs": cfg.scheduler_config.max_num_seqs,
            "max_model_len": cfg.scheduler_config.max_model_len,
            "scheduler_cls": str(cfg.scheduler_config.scheduler_cls),
        },
        "ascend_graph": {
            "enabled": graph.enabled,
            "graph_batch_sizes": list(graph.graph_batch_sizes),
            "enable_multistream_mla": graph.enable_multistream_mla,
            "enable_multistream_moe": graph.enable_multistream_moe,
            "enable_kv_nz": graph.enable_kv_nz,
            "enable_view_optimize": graph.enable_view_optimize,
            "use_cached_graph": graph.use_cached_graph,
        },
        "ascend_scheduler": {
            "enabled": asc.ascend_scheduler_config.enabled,
            "enable_chunked_prefill": getattr(asc.ascend_scheduler_config, "enable_chunked_prefill", None),
        },
        "enable_sleep_mode": cfg.model_config.enable_sleep_mode,
        "enforce_eager": cfg.model_config.enforce_eager,
        "prefix_caching": cfg.cache_config.enable_prefix_caching,
        "expert_parallel": cfg.parallel_config.enable_expert_parallel,
        "data_parallel_size": cfg.parallel_config.data_parallel_size,
        "data_parallel_rank": cfg.parallel_config.data_parallel_rank,
        "tensor_parallel_size": cfg.parallel_config.tensor_parallel_size,
        "worker_cls": cfg.parallel_config.worker_cls,
        "compilation_level": int(cfg.compilation_config.level),
    }


def decode_against_hf(llm, rank: int) -> dict:
    """Weights from the model directory through the lifecycle (onload -> the model's loader -> KV re-init),
    a greedy decode with log-probs on this rank's prompts, the same tokens scored by transformers."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from verl.utils.vllm_utils import patch_vllm_moe_model_weight_loader
    from vllm import SamplingParams

    from verl_patches.rollout.lifecycle import RolloutLifecycle, model_runner_of

    weights = load_file(os.path.join(model_dir, "model.safetensors"))
    llm.wake_up(tags=["weights"])
    patch_vllm_moe_model_weight_loader(model_runner_of(llm).model)  # as the sharding manager does each sync
    RolloutLifecycle(llm, device=model_runner_of(llm).device).load_weights(iter(weights.items()))
    llm.wake_up(tags=["kv_cache"])
    prompts = [tokenizer.encode(text) for text in ([f"{rank} + 1 =", "2 + 2 ="], [f"{rank} + 2 =", "1 + 1 ="])[rank]]
    params = SamplingParams(temperature=0.0, max_tokens=4, logprobs=0, ignore_eos=True)
    # the dispatcher's own count of the MC2 ops run (in the TorchAir graphs too): which of vllm-ascend's branches ran
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        outs = llm.generate(prompts=[{"prompt_token_ids": p} for p in prompts], sampling_params=params, use_tqdm=False)
    mc2_calls = {e.key.split("::")[-1]: e.count for e in prof.key_averages() if "npu_moe_distribute" in e.key}
    hf = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    worst, tokens = 0.0, []
    for prompt, out in zip(prompts, outs):
        gen = list(out.outputs[0].token_ids)
        got = [lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, gen)]
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + gen])).logits[0, len(prompt) - 1 : -1].double()
        want = torch.log_softmax(logits, -1)
        hf_greedy = want.argmax(-1).tolist()
        ref = [want[i, t].item() for i, t in enumerate(gen)]
        worst = max([worst] + [abs(a - b) for a, b in zip(got, ref)])
        tokens.append({"vllm": gen, "hf_greedy": hf_greedy})
    return {"tokens": tokens, "logprob_abs_diff_max": worst, "mc2_calls": mc2_calls}


model_dir = spec["model_dir"]
hf_config = AutoConfig.from_pretrained(model_dir)
out["model_config"] = json.load(open(os.path.join(model_dir, "config.json")))
tokenizer = AutoTokenizer.from_pretrained(model_dir)
for name, case in spec["cases"].items():
    seen.clear()
    config = OmegaConf.merge(OmegaConf.create(spec["rollout"]), case)
    result: dict = {}
    try:
        rollout = vllm_rollout_spmd.vLLMRollout(model_dir, config, tokenizer, hf_config)
        result["stopped_at"] = None
        if name == "a3":
            result["built"] = describe(rollout.inference_engine)  # what the job log's engine line reports
            result["decoded"] = decode_against_hf(rollout.inference_engine, rank)
    except BaseException as e:  # noqa: BLE001  (where it stops is the data)
        frames = traceback.extract_tb(e.__traceback__)
        tb = frames[-1]
        result["stopped_at"] = {
            "error": type(e).__name__,
            "message": " | ".join(str(e).splitlines()[:4])[:600] if str(e) else "",
            "file": os.path.relpath(tb.filename),
            "line": tb.lineno,
            "through": sorted({os.path.relpath(f.filename).split(os.sep)[0] for f in frames}),
        }
    result["engine_args"] = {k: v for k, v in seen.get("engine_args", {}).items()}
    if "vllm_config" in seen:
        result["engine"] = summary(seen["vllm_config"])
    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():  # the worker set up vLLM's groups before its model runner stopped
        result["groups"] = {
            "tp": ps.get_tp_group().world_size,
            "dp": ps.get_dp_group().world_size,
            "ep": ps.get_ep_group().world_size,
        }
    result["dp_env"] = {
        k: os.environ.get(k) for k in ("VLLM_DP_SIZE", "VLLM_DP_RANK", "VLLM_DP_MASTER_PORT", DP_BASE_PORT_ENV)
    }
    out["cases"][name] = result
with open(sys.argv[5], "w") as result_file:  # a file, not stdout: vLLM logs to stdout too
    json.dump(out, result_file, default=str)
