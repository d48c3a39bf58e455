"""Whether this process runs F4 (the KV-NZ fix of vllm-ascend's MLA): one flag, derived from one config.

F4 (patches/vllm_ascend/attention/kv_nz.py) applies only where the rollout's TorchAir graph mode and
`enable_kv_nz` are both on. Patches are applied when a process starts, before the trainer config reaches
it, so the launcher exports `VERL_PATCHES_KV_NZ` from the composed config (`kv_nz_env`) and the engine
build refuses a config that disagrees with the flag (`engine_factory.check_kv_nz_patch`). F4 is refused
together with chunked prefill, which every A3 profile runs (`driver.config_checks.kv_nz_problems`, run by the
preflight and at the job's start): in steps that mix prefill chunks with decodes it drops the decode tokens'
only KV write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_patches.worker_calls.env_names import KV_NZ_FLAG

GRAPH_CONFIG_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.torchair_graph_config"


def kv_nz_wanted(torchair_graph_config: Mapping[str, Any] | None) -> bool:
    """True when vllm-ascend's `torchair_graph_config` turns on graph mode and the NZ cache (KV-NZ has no
    effect without graph mode: only the graph-mode branches of mla_v1 read it)."""
    graph = torchair_graph_config or {}
    return bool(graph.get("enabled")) and bool(graph.get("enable_kv_nz"))


def kv_nz_env(config: Any) -> dict[str, str]:
    """The flag's value for a composed trainer config (an OmegaConf tree or nested mappings)."""
    node: Any = config
    for key in GRAPH_CONFIG_KEY.split("."):
        node = node.get(key) if node is not None and hasattr(node, "get") else None
    return {KV_NZ_FLAG: "1" if kv_nz_wanted(node) else "0"}
