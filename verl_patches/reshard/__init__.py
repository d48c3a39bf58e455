"""Reshard between the training (Megatron) and rollout (vLLM) layouts (vendor items C2, E2, E3).

Pure planners, plain data in and out, no torch.distributed:
  layout       Megatron rank order (RankGenerator semantics) and the vLLM rollout layout
  exchange     one rank's part of an all-to-all-v (the common output of the planners)
  dp_plan      rollout chunks → Megatron data-parallel slices (C2)
  ep_plan      grouped-GEMM expert routing, training TP-extend-EP → vLLM EP (E2); layout conventions
  pp_plan      pipeline lockstep exchange: eligibility, layer offsets, global names, buckets (E3)
  model_dims   DeepSeek-V3 dimensions from config.json and the per-stage parameter list
  cost_model   bytes per rank, peak extra memory, calls: ours, the vendor's paths, the lower bound
Thin execution layer:
  executors    all_to_all_single / all-gather on a caller-given process group
  rollout_experts  the (expert, projection, tensor) entries the rollout hands vLLM's loader
  tensor_cache the worker-side D2D cache and its config preconditions

Importing this package has no side effects.
"""
