"""The A3 rollout engine (vLLM 0.9.1 + vllm-ascend 0.9.1) as verl drives it, on A3 and on a CPU host.

Modules (one job each):
  lifecycle       E1/F1: weight offload/onload, KV cache init/free (no sleep mode, no camem), MLA rebuild,
                  storage accounting; the interface the weight-sync sharding manager drives
  kv_cache_config F3: engine-core KV cache configs saved at first init and reused on every re-init
  dp_env          F2: vLLM DP groups for expert parallelism (VLLM_DP_* per rank, ports, host address)
  engine_factory  the `LLM` verl builds (engine arguments, sleep/wake mapped to the lifecycle)
  engine_report   the built engine's classes, graph mode and groups: the job log's line per instance
  graph_binding   TorchAir graphs and moving weights (frozen parameters: rebuild when moved)
  verl_hooks      wraps of verl's vLLMRollout: F2 env before parallel state, real torch.compile (F1)
  kernels         vllm-ascend's compiled kernels built from the pinned sdist; kernels_path finds them
  rebalance/      F5: planner, hooks, metadata exchange, recovery (KV migration itself: A3-only, not here)
  standin/        test double only (VERL_PATCHES_ROLLOUT_STANDIN=1): an LLM with verl's surface backed by
                  transformers' DeepseekV3ForCausalLM
The runtime patches that install these live in verl_patches/patches/{vllm,vllm_ascend,verl/workers/rollout}.
"""
