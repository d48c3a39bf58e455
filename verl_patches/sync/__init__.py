"""Weight sync Megatron (training) → vLLM (rollout) for DeepSeek-V3 (vendor items E1, E2, E3, C4, G10).

  path              which sync path is active (``NO_ALL_TO_ALL_RESHARD``); standard library only, for the audit
  param_table       per-stage parameter table derived from config.json (pure)
  plan              the whole-model sync plan: lockstep PP exchange, legacy broadcast, expert routing (pure)
  convert           TP merge and Megatron → HF tensor split (MLA fused qkv, gate/up)
  generator         executes a plan on one rank and streams ``(hf_name, tensor)`` for ``load_weights``
  megatron_source   reads the plan inputs (layouts, groups, shards) from a live Megatron model
  sharding_manager  the E1 sharding manager that drives the rollout lifecycle around the sync

Importing this package has no side effects.
"""
