"""The MoE inference ops as dispatcher ops, ``torch.ops.npu.<name>``, registered with the real torch_npu's contract.

vllm-ascend traces its decode step with ``torch.compile(fullgraph=True)`` (TorchAir graph mode); dynamo can
only keep an op whose outputs it can size without running it, and must not look inside a collective. A
dispatcher op with a Meta function is opaque to it and sized from its arguments. Each op is registered by
`wheel_contract.registration`: the schema the pinned torch_npu wheel registers (names, types, defaults,
keyword-only marks: vllm-ascend's keyword calls bind as on A3, and a ``group_tp`` left out arrives as ``""``),
the wheel's Meta function (every op here has one), the
documented limits, and the kernel for CompositeExplicitAutograd, so they run for tensors of any device; there is
no backward (inference ops).

`register_moe_ops()` defines them once per process (the stand-in torch_npu calls it at import) and returns
``{name: torch.ops.npu.<name>}``. An entry of `OPS` is ``name -> (kernel, shape function)``; the schema is the
wheel's, and the shape function would size the op only if the wheel had no Meta function for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl_patches.npu_emulation.ops import grouped_matmul, moe_distribute, moe_routing
from verl_patches.npu_emulation.wheel_contract.registration import Emulated, register

NAMESPACE = "npu"

# name -> (kernel, shape function)
OPS: dict[str, tuple[Callable, Callable]] = {
    "npu_moe_gating_top_k": (moe_routing.npu_moe_gating_top_k, moe_routing.gating_top_k_shapes),
    "npu_moe_gating_top_k_softmax": (moe_routing.npu_moe_gating_top_k_softmax, moe_routing.gating_top_k_softmax_shapes),
    "npu_moe_init_routing": (moe_routing.npu_moe_init_routing, moe_routing.init_routing_shapes),
    "npu_moe_compute_expert_tokens": (moe_routing.npu_moe_compute_expert_tokens, moe_routing.expert_tokens_shapes),
    "npu_moe_finalize_routing": (moe_routing.npu_moe_finalize_routing, moe_routing.finalize_routing_shapes),
    "npu_moe_re_routing": (moe_routing.npu_moe_re_routing, moe_routing.re_routing_shapes),
    "npu_grouped_matmul": (grouped_matmul.npu_grouped_matmul, grouped_matmul.grouped_matmul_shapes),
    "npu_moe_distribute_dispatch": (moe_distribute.npu_moe_distribute_dispatch, moe_distribute.dispatch_shapes),
    "npu_moe_distribute_combine": (moe_distribute.npu_moe_distribute_combine, moe_distribute.combine_shapes),
    "npu_moe_distribute_dispatch_v2": (
        moe_distribute.npu_moe_distribute_dispatch_v2,
        moe_distribute.dispatch_v2_shapes,
    ),
    "npu_moe_distribute_combine_v2": (moe_distribute.npu_moe_distribute_combine_v2, moe_distribute.combine_v2_shapes),
}


def register_moe_ops() -> dict[str, torch._ops.OpOverloadPacket]:
    """Define the ops (once per process); returns {name: torch.ops.npu.<name>}."""
    entries = [Emulated(f"{NAMESPACE}::{name}", kernel, fallback_fake=shapes) for name, (kernel, shapes) in OPS.items()]
    register(entries)
    namespace = getattr(torch.ops, NAMESPACE)
    return {name: getattr(namespace, name) for name in OPS}
