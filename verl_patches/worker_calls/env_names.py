"""The environment variables the launch and the trainer entry set for every worker process, by name.

  KV_NZ_FLAG         "1" installs F4 (vllm-ascend's KV cache in NZ layout) at process start; the launch sets it
                     from the config's ``enable_kv_nz`` (`rollout.kv_nz_switch.kv_nz_env`), the declared patch
                     reads it
  DIES_PER_CARD_ENV  NPU dies per card, for the per-card throughput; the trainer entry sets it from
                     ``overlay.dies_per_card``, the step metrics read it
  DP_BASE_PORT_ENV   vLLM's DP master ports are this + 1 onwards, one per DP group; the launch sets it (the
                     cluster's MASTER_PORT, the tiny run's free block), every rollout rank reads it
                     (`rollout.dp_env`)

Names only: the launch (which sets them) and the engines and patches (which read them) import them from here,
so the launch needs no engine for a name. How each is parsed is `base.env_registry`'s entry of that name.
"""

from __future__ import annotations

KV_NZ_FLAG = "VERL_PATCHES_KV_NZ"
DIES_PER_CARD_ENV = "VERL_PATCHES_DIES_PER_CARD"
DP_BASE_PORT_ENV = "VERL_PATCHES_VLLM_DP_BASE_PORT"
