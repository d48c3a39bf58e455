"""Fresh interpreter (argv: tiny model dir): verl v0.4.0's own vLLMRollout on a CPU host, with our
patches activated by the prelude. Builds the rollout (LLM -> CPU stand-in, sleep(level=1) -> free KV +
offload), drives one lifecycle round and verl's generate_sequences on a DataProto. Prints one JSON line."""

import json
import os
import sys

import verl_patches.prelude_patch  # noqa: F401  (what every job process runs first)

# isort: split
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from verl_patches.base.free_port import free_port  # noqa: E402

port = free_port()
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)

from verl import DataProto  # noqa: E402
from verl.workers.rollout.vllm_rollout import vllm_rollout_spmd, vLLMRollout  # noqa: E402

from verl_patches.rollout.lifecycle import RolloutLifecycle  # noqa: E402

model_dir = sys.argv[1]
base = OmegaConf.load(os.path.join("verl", "trainer", "config", "ppo_trainer.yaml")).actor_rollout_ref.rollout
config = OmegaConf.merge(
    base,
    {
        "name": "vllm",
        "prompt_length": 6,
        "response_length": 5,
        "n": 2,
        "temperature": 1.0,
        "top_k": -1,
        "top_p": 1.0,
        "dtype": "float32",
        "load_format": "auto",
        # the A3 rollout's settings that upstream's __init__ refuses (F1 drops both checks)
        "enforce_eager": False,
        "free_cache_engine": True,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 8,
        "max_model_len": 16,
        "max_num_seqs": 8,
        "engine_kwargs": {"vllm": {"max_num_seqs": 8}},
        "tensor_model_parallel_size": 1,
    },
)
hf_config = type("C", (), {"max_position_embeddings": 64, "rope_scaling": None})()
tokenizer = type("T", (), {"pad_token_id": 0})()
rollout = vLLMRollout(model_dir, config, tokenizer, hf_config)
engine = rollout.inference_engine
out = {
    "llm_class": f"{type(engine).__module__}.{type(engine).__name__}",
    "engine_max_num_seqs": engine.max_num_seqs,
    "engine_sleep_mode": engine.engine_kwargs.get("enable_sleep_mode"),
    "LLM_name_in_verl": f"{vllm_rollout_spmd.LLM.__module__}.{vllm_rollout_spmd.LLM.__name__}",
}
life = RolloutLifecycle(engine, device="cpu")
out["bytes_after_build"] = life.device_bytes()
engine.wake_up(tags=["weights"])
from safetensors.torch import load_file  # noqa: E402

weights = load_file(os.path.join(model_dir, "model.safetensors"))
out["loaded"] = len(life.load_weights(weights.items()))
engine.wake_up(tags=["kv_cache"])
idx = torch.tensor([[0, 0, 2, 5, 7, 9], [0, 2, 11, 13, 4, 6]])
mask = (idx != 0).long()
positions = (mask.cumsum(-1) - 1).clamp(min=0)
batch = DataProto.from_dict(
    tensors={"input_ids": idx, "attention_mask": mask, "position_ids": positions}, meta_info={"eos_token_id": 1}
)
result = rollout.generate_sequences(batch)
out["responses_shape"] = list(result.batch["responses"].shape)
out["input_ids_shape"] = list(result.batch["input_ids"].shape)
out["rollout_log_probs_finite"] = (
    bool(torch.isfinite(result.batch["rollout_log_probs"][result.batch["responses"] != 0]).all())
    if "rollout_log_probs" in result.batch.keys()
    else None
)
engine.sleep(level=1)
out["bytes_after_sleep"] = life.device_bytes()
import verl_patches.patching.registry as reg  # noqa: E402

out["applied"] = sorted(
    r.patch.name for r in reg.get_registry().records if r.status == "applied" and "vllm_rollout" in r.patch.name
)
print(json.dumps(out))
