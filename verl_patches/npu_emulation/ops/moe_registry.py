"""The MoE inference ops as dispatcher ops, ``torch.ops.npu.<name>``, registered with the real torch_npu's contract.

vllm-ascend traces its decode step with ``torch.compile(fullgraph=True)`` (TorchAir graph mode); dynamo can
only keep an op whose outputs it can size without running it, and must not look inside a collective. A
dispatcher op with a Meta function is opaque to it and sized from its arguments. Each op is registered by
`wheel_contract.registration`: the schema the pinned torch_npu wheel registers (names, types, defaults,
keyword-only marks: vllm-ascend's keyword calls bind as on A3, and a ``group_tp`` left out arrives as ``""``),
the wheel's Meta function (every op here has one; the shape functions below are not used while it does), the
documented limits, and the kernel for CompositeExplicitAutograd, so they run for tensors of any device; there is
no backward (inference ops).

`register_moe_ops()` defines them once per process (the stand-in torch_npu calls it at import) and returns
``{name: torch.ops.npu.<name>}``. An entry of `OPS` is ``name -> (..., kernel, shape function)``: only the last two
are read (the schema is the wheel's).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verl_patches.npu_emulation.ops import grouped_matmul, moe_distribute, moe_routing
from verl_patches.npu_emulation.wheel_contract.registration import Emulated, register

NAMESPACE = "npu"

# name -> (schema after the name, kernel, fake)
OPS: dict[str, tuple[str, Callable, Callable]] = {
    "npu_moe_gating_top_k": (
        "(Tensor x, int k, *, Tensor? bias=None, int k_group=1, int group_count=1, int group_select_mode=0, "
        "int renorm=0, int norm_type=0, bool out_flag=False, float routed_scaling_factor=1.0, float eps=1e-20) "
        "-> (Tensor, Tensor, Tensor)",
        moe_routing.npu_moe_gating_top_k,
        moe_routing.gating_top_k_shapes,
    ),
    "npu_moe_gating_top_k_softmax": (
        "(Tensor x, Tensor? finished=None, int k=1) -> (Tensor, Tensor, Tensor)",
        moe_routing.npu_moe_gating_top_k_softmax,
        moe_routing.gating_top_k_softmax_shapes,
    ),
    "npu_moe_init_routing": (
        "(Tensor x, Tensor row_idx, Tensor expert_idx, int active_num) -> (Tensor, Tensor, Tensor)",
        moe_routing.npu_moe_init_routing,
        moe_routing.init_routing_shapes,
    ),
    "npu_moe_compute_expert_tokens": (
        "(Tensor sorted_expert_for_source_row, int num_expert) -> Tensor",
        moe_routing.npu_moe_compute_expert_tokens,
        moe_routing.expert_tokens_shapes,
    ),
    "npu_moe_finalize_routing": (
        "(Tensor expanded_permuted_rows, Tensor? skip1, Tensor? skip2, Tensor? bias, Tensor? scales, "
        "Tensor expanded_src_to_dst_row, Tensor? export_for_source_row, int? drop_pad_mode=0) -> Tensor",
        moe_routing.npu_moe_finalize_routing,
        moe_routing.finalize_routing_shapes,
    ),
    "npu_moe_re_routing": (
        "(Tensor tokens, Tensor expert_token_num_per_rank, *, Tensor? per_token_scales=None, "
        "int expert_token_num_type=1, int idx_type=0) -> (Tensor, Tensor, Tensor, Tensor)",
        moe_routing.npu_moe_re_routing,
        moe_routing.re_routing_shapes,
    ),
    "npu_grouped_matmul": (
        "(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
        "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, "
        "Tensor? group_list=None, Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
        "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=-1, int? group_list_type=0, "
        "int? act_type=0, int[]? tuning_config=None, ScalarType? output_dtype=None) -> Tensor[]",
        grouped_matmul.npu_grouped_matmul,
        grouped_matmul.grouped_matmul_shapes,
    ),
    "npu_moe_distribute_dispatch": (
        "(Tensor x, Tensor expert_ids, str? group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
        "Tensor? scales=None, Tensor? x_active_mask=None, Tensor? expert_scales=None, str? group_tp=None, "
        "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, int expert_token_nums_type=1) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        moe_distribute.npu_moe_distribute_dispatch,
        moe_distribute.dispatch_shapes,
    ),
    "npu_moe_distribute_combine": (
        "(Tensor expand_x, Tensor expert_ids, Tensor expand_idx, Tensor ep_send_counts, Tensor expert_scales, "
        "str? group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, Tensor? tp_send_counts=None, "
        "Tensor? x_active_mask=None, Tensor? activation_scale=None, Tensor? weight_scale=None, "
        "Tensor? group_list=None, Tensor? expand_scales=None, Tensor? shared_expert_x=None, str? group_tp=None, "
        "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, int global_bs=0, int out_dtype=0, int comm_quant_mode=0, "
        "int group_list_type=0) -> Tensor",
        moe_distribute.npu_moe_distribute_combine,
        moe_distribute.combine_shapes,
    ),
    # the v2 pair, as the torch_npu 2.5.1.post1 wheel's npu_native_functions_by_codegen.yaml writes them
    "npu_moe_distribute_dispatch_v2": (
        "(Tensor x, Tensor expert_ids, str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
        'Tensor? scales=None, Tensor? x_active_mask=None, Tensor? expert_scales=None, str group_tp="", '
        "int tp_world_size=0, int tp_rank_id=0, int expert_shard_type=0, int shared_expert_num=1, "
        "int shared_expert_rank_num=0, int quant_mode=0, int global_bs=0, int expert_token_nums_type=1) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
        moe_distribute.npu_moe_distribute_dispatch_v2,
        moe_distribute.dispatch_v2_shapes,
    ),
    "npu_moe_distribute_combine_v2": (
        "(Tensor expand_x, Tensor expert_ids, Tensor assist_info_for_combine, Tensor ep_send_counts, "
        "Tensor expert_scales, str group_ep, int ep_world_size, int ep_rank_id, int moe_expert_num, *, "
        "Tensor? tp_send_counts=None, Tensor? x_active_mask=None, Tensor? expand_scales=None, "
        'Tensor? shared_expert_x=None, str group_tp="", int tp_world_size=0, int tp_rank_id=0, '
        "int expert_shard_type=0, int shared_expert_num=1, int shared_expert_rank_num=0, int global_bs=0, "
        "int comm_quant_mode=0) -> Tensor",
        moe_distribute.npu_moe_distribute_combine_v2,
        moe_distribute.combine_v2_shapes,
    ),
}


def register_moe_ops() -> dict[str, torch._ops.OpOverloadPacket]:
    """Define the ops (once per process); returns {name: torch.ops.npu.<name>}."""
    entries = [Emulated(f"{NAMESPACE}::{name}", row[-2], fallback_fake=row[-1]) for name, row in OPS.items()]
    register(entries)
    namespace = getattr(torch.ops, NAMESPACE)
    return {name: getattr(namespace, name) for name in OPS}
