"""The CPU proof's rollout decodes through vllm-ascend's MC2 path, the one A3 decodes through.

`get_fused_moe_state(ep_size, with_prefill)` picks the MoE communication by expert-parallel size: MC2
(`npu_moe_distribute_dispatch`/`combine`) for decode at EP >= 16, All2All below, AllGather at EP 1. The A3
profiles decode at EP 256 (MC2) and prefill through All2All. The CPU proof runs EP 2 (two processes on two
cores), where upstream would pick All2All for decode as well: a path A3 never decodes through, and one
vllm-ascend itself notes cannot run inside a TorchAir graph (its `.cpu().tolist()` split sizes). So on a CPU
host, decode at any EP > 1 is MC2, as at A3's size; prefill and EP 1 are decided by the original.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def wrap_fused_moe_state(original: Callable[..., Any]) -> Callable[..., Any]:
    """`get_fused_moe_state` that decodes through MC2 at every EP > 1 (A3's decode path at EP >= 16)."""

    @functools.wraps(original)
    def fused_moe_state(ep_size: int, with_prefill: bool) -> Any:
        state = original(ep_size, with_prefill)
        if ep_size > 1 and not with_prefill:
            # lazy: the enum lives in the module this wraps; resolved when the engine runs
            from vllm_ascend.ascend_forward_context import FusedMoEState

            if state == FusedMoEState.All2All:
                return FusedMoEState.MC2
        return state

    return fused_moe_state
