"""At the CPU proof's rollout EP 2, decode takes vllm-ascend's MC2 path (A3's decode path at EP 256); prefill
and EP 1 stay as upstream decides (declared patch vllm_ascend.forward_context.mc2_decode_at_small_ep)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("ep", "prefill", "upstream", "here"),
    [
        (1, False, "AllGather", "AllGather"),
        (1, True, "AllGather", "AllGather"),
        (2, False, "All2All", "MC2"),
        (2, True, "All2All", "All2All"),
        (8, False, "All2All", "MC2"),
        (16, False, "MC2", "MC2"),
        (256, False, "MC2", "MC2"),
        (256, True, "All2All", "All2All"),
    ],
)
def test_decode_at_any_ep_above_one_is_mc2_on_a_cpu_host(ep: int, prefill: bool, upstream: str, here: str) -> None:
    from vllm_ascend import ascend_forward_context as ctx

    original = getattr(ctx.get_fused_moe_state, "__wrapped__", None)
    assert original is not None, "the MC2 patch is not applied in this CPU process"
    assert original(ep, prefill) == ctx.FusedMoEState[upstream]
    assert ctx.get_fused_moe_state(ep, prefill) == ctx.FusedMoEState[here]
