"""The A3 rollout engine (vLLM 0.9.1 + vllm-ascend 0.9.1) as verl drives it, and its CPU stand-in.

Modules (one job each):
  dp_env          F2: vLLM DP groups for expert parallelism (VLLM_DP_* per rank, ports, host address)
  kv_cache_config F3: engine-core KV cache configs saved at first init and reused on every re-init
  compile_toggle  F1: the real torch.compile while the rollout is built/runs, MindSpeed's substitute otherwise
  lifecycle       E1/F1: weight offload/onload and KV cache init/free (no sleep mode, no camem), with
                  storage accounting; the interface the weight-sync sharding manager drives
  dp_sync         the per-step DP forward-metadata all-reduce over the device group (HCCL on A3)
  rebalance/      F5: planner, hooks, metadata packing, recovery
  standin/        CPU only: an LLM with verl's surface backed by transformers' DeepseekV3ForCausalLM
"""
