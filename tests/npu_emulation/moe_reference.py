"""Shared by the MoE op tests: seeded inputs, vllm-ascend's EP1 op chain (`fused_experts` without an expert map),
and the per-token reference out[t] = sum_k w[t, k] * expert_{e[t, k]}(x[t]) in float64."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verl_patches.npu_emulation.ops.activation import npu_swiglu


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def distinct_choices(tokens: int, experts: int, k: int, seed: int) -> torch.Tensor:
    g = gen(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)]).to(torch.int32)


@dataclass(frozen=True)
class EPBatch:
    """An EP group's seeded batch, built identically on every rank: every rank's tokens (x, their distinct expert
    choices, routing weights, rank by rank) and every expert's weights (vLLM's layout, see `expert_mlp`)."""

    tokens: tuple[int, ...]  # tokens per rank
    x: torch.Tensor  # [sum(tokens), H]
    ids: torch.Tensor  # [sum(tokens), K] int32
    weights: torch.Tensor  # [sum(tokens), K]
    w13: torch.Tensor  # [E, 2I, H]
    w2: torch.Tensor  # [E, H, I]

    def rows(self, rank: int) -> slice:
        """The rows of ``rank``'s tokens."""
        return slice(sum(self.tokens[:rank]), sum(self.tokens[: rank + 1]))

    def experts_of(self, rank: int) -> slice:
        """The experts ``rank`` holds (E / ranks each, in rank order)."""
        local = self.w13.shape[0] // len(self.tokens)
        return slice(rank * local, (rank + 1) * local)


def ep_batch(tokens, experts, k, hidden, inter, seed, stride=1, dtype=torch.float32) -> EPBatch:
    """`EPBatch` for ``tokens`` per rank, in ``dtype``; x, the choices, the weights, w13 and w2 come from the seeds
    ``seed``, ``seed + stride``, ... ``seed + 4 * stride``, the experts' weights scaled by 1/4."""
    total = sum(tokens)
    seeds = [seed + i * stride for i in range(5)]
    return EPBatch(
        tokens=tuple(tokens),
        x=torch.randn(total, hidden, generator=gen(seeds[0])).to(dtype),
        ids=distinct_choices(total, experts, k, seeds[1]),
        weights=torch.rand(total, k, generator=gen(seeds[2])).to(dtype),
        w13=(torch.randn(experts, 2 * inter, hidden, generator=gen(seeds[3])) / 4).to(dtype),
        w2=(torch.randn(experts, hidden, inter, generator=gen(seeds[4])) / 4).to(dtype),
    )


def vllm_row_idx(tokens: int, k: int) -> torch.Tensor:
    """What vllm-ascend passes as row_idx: slot (t, k) holds k * T + t."""
    return torch.arange(tokens * k, dtype=torch.int32).view(k, tokens).permute(1, 0).contiguous()


def expert_mlp(x_t: torch.Tensor, w13_e: torch.Tensor, w2_e: torch.Tensor) -> torch.Tensor:
    """One expert on one token, vLLM's weight layout: w13 [2I, H] (gate rows, then up rows), w2 [H, I]."""
    inter = w2_e.shape[1]
    gate, up = w13_e[:inter] @ x_t, w13_e[inter:] @ x_t
    return w2_e @ (gate * torch.sigmoid(gate) * up)


def moe_reference(x, w13, w2, weights, ids) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            out[t] += float(weights[t, j]) * expert_mlp(x[t].double(), w13[e].double(), w2[e].double())
    return out


def fused_experts_ep1(x, w13, w2, topk_weights, topk_ids):
    """The op sequence of vllm_ascend.ops.fused_moe.fused_experts without an expert map (EP 1)."""
    tokens, top_k = topk_ids.shape
    row_idx = (
        torch.arange(tokens * top_k, dtype=torch.int32, device=x.device).view(top_k, -1).permute(1, 0).contiguous()
    )
    sorted_x, expanded_row_idx, expanded_expert_idx = torch.ops.npu.npu_moe_init_routing(
        x, row_idx=row_idx, expert_idx=topk_ids, active_num=tokens
    )
    expert_tokens = torch.ops.npu.npu_moe_compute_expert_tokens(expanded_expert_idx, w13.shape[0]).to(torch.int64)
    gate_up = torch.ops.npu.npu_grouped_matmul(
        x=[sorted_x], weight=[w13.transpose(1, 2)], split_item=2, group_list_type=0, group_type=0,
        group_list=expert_tokens,
    )  # fmt: skip
    down = torch.ops.npu.npu_grouped_matmul(
        x=[npu_swiglu(torch.cat(gate_up, dim=0))], weight=[w2.transpose(1, 2)], split_item=2, group_list_type=0,
        group_type=0, group_list=expert_tokens,
    )  # fmt: skip
    return torch.ops.npu.npu_moe_finalize_routing(
        torch.cat(down, dim=0), skip1=None, skip2=None, bias=None, scales=topk_weights,
        expanded_src_to_dst_row=expanded_row_idx, export_for_source_row=topk_ids,
    )  # fmt: skip


def fused_experts_mc2(x, w13_local, w2_local, topk_weights, topk_ids, group_name, ep_world_size, ep_rank, experts,
                      global_bs, *, x_active_mask=None, v2=False):  # fmt: skip
    """The op sequence of vllm_ascend.ops.fused_moe.fused_experts_with_mc2 on A3 (the A3 TP arguments, no shared
    experts): the v1 dispatch/combine pair, or with `v2` the v2 pair with x_active_mask and assist_info_for_combine;
    w13_local / w2_local are this rank's experts. Returns (out, dispatch's outputs)."""
    npu = torch.ops.npu
    stage = dict(
        expert_shard_type=0, shared_expert_rank_num=0, moe_expert_num=experts, global_bs=global_bs,
        group_ep=group_name, ep_world_size=ep_world_size, ep_rank_id=ep_rank, group_tp=group_name, tp_world_size=1,
        tp_rank_id=0,
    )  # fmt: skip
    masked = {"x_active_mask": x_active_mask} if v2 else {}
    dispatch = npu.npu_moe_distribute_dispatch_v2 if v2 else npu.npu_moe_distribute_dispatch
    dispatched = dispatch(x=x, expert_ids=topk_ids, scales=None, quant_mode=0, **masked, **stage)
    expand_x, _, expand_idx, expert_token_nums, ep_recv_counts = dispatched[0:5]
    group_list = expert_token_nums.to(torch.int64)
    gate_up = npu.npu_grouped_matmul(
        x=[expand_x], weight=[w13_local.transpose(1, 2)], split_item=2, group_list_type=1, group_type=0,
        group_list=group_list,
    )  # fmt: skip
    down = npu.npu_grouped_matmul(
        x=[npu_swiglu(torch.cat(gate_up, dim=0))], weight=[w2_local.transpose(1, 2)], split_item=2,
        group_list_type=1, group_type=0, group_list=group_list,
    )  # fmt: skip
    back = {"assist_info_for_combine": expand_idx} if v2 else {"expand_idx": expand_idx}
    combine = npu.npu_moe_distribute_combine_v2 if v2 else npu.npu_moe_distribute_combine
    out = combine(
        expand_x=torch.cat(down, dim=0), expert_ids=topk_ids, expert_scales=topk_weights.to(torch.float32),
        ep_send_counts=ep_recv_counts, tp_send_counts=dispatched[5], **back, **masked, **stage,
    )  # fmt: skip
    return out, dispatched


def all_to_all_rows(rows, send_sizes, recv_sizes, group):
    """ep_group.all_to_all(rows, 0, 0, send_sizes, recv_sizes) of vllm-ascend, over all_to_all_single (gloo has no
    list-form all_to_all)."""
    out = rows.new_empty(sum(recv_sizes), *rows.shape[1:])
    torch.distributed.all_to_all_single(out, rows.contiguous(), recv_sizes, send_sizes, group=group)
    return out


def fused_experts_all2all(x, w13_local, w2_local, topk_weights, topk_ids, experts, group):
    """The op sequence of vllm_ascend.ops.fused_moe.fused_experts_with_all2all with an expert map (EP > 1)."""
    world = torch.distributed.get_world_size(group)
    tokens, top_k = topk_ids.shape
    local = experts // world
    row_idx = (
        torch.arange(tokens * top_k, dtype=torch.int32, device=x.device).view(top_k, -1).permute(1, 0).contiguous()
    )
    rows, expanded_row_idx, expanded_expert_idx = torch.ops.npu.npu_moe_init_routing(
        x, row_idx=row_idx, expert_idx=topk_ids, active_num=tokens
    )
    scatter_sizes = torch.bincount(expanded_expert_idx, minlength=experts).view(world, -1).sum(-1)
    gather_sizes = torch.empty_like(scatter_sizes)
    torch.distributed.all_to_all_single(gather_sizes, scatter_sizes, group=group)
    send, recv = scatter_sizes.tolist(), gather_sizes.tolist()
    rows = all_to_all_rows(rows, send, recv, group)
    local_expert_idx = all_to_all_rows(expanded_expert_idx % local, send, recv, group)
    sorted_local_expert_idx, sorted_idx = torch.sort(local_expert_idx)
    expert_tokens = torch.ops.npu.npu_moe_compute_expert_tokens(sorted_local_expert_idx, local).to(torch.int64)
    gate_up = torch.ops.npu.npu_grouped_matmul(
        x=[rows[sorted_idx]], weight=[w13_local.transpose(1, 2)], split_item=2, group_list_type=0, group_type=0,
        group_list=expert_tokens,
    )  # fmt: skip
    down = torch.ops.npu.npu_grouped_matmul(
        x=[npu_swiglu(torch.cat(gate_up, dim=0))], weight=[w2_local.transpose(1, 2)], split_item=2,
        group_list_type=0, group_type=0, group_list=expert_tokens,
    )  # fmt: skip
    back = all_to_all_rows(torch.cat(down, dim=0)[torch.argsort(sorted_idx)], recv, send, group)
    return torch.ops.npu.npu_moe_finalize_routing(
        back, skip1=None, skip2=None, bias=None, scales=topk_weights, expanded_src_to_dst_row=expanded_row_idx,
        export_for_source_row=topk_ids,
    )  # fmt: skip


def tiny_moe(tokens=6, hidden=16, inter=8, experts=8, k=2, seed=30):
    x = torch.randn(tokens, hidden, generator=gen(seed))
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen(seed + 1)) / 4
    w2 = torch.randn(experts, hidden, inter, generator=gen(seed + 2)) / 4
    ids = distinct_choices(tokens, experts, k, seed + 3)
    weights = torch.rand(tokens, k, generator=gen(seed + 4))
    return x, w13, w2, weights, ids
