"""MC2 dispatch / combine (`npu_moe_distribute_dispatch` / `_combine`) on 2 CPU ranks over gloo, each rank with its
own number of tokens: vllm-ascend's MC2 op sequence (dispatch, grouped matmuls on the rank's experts, combine)
gives each token sum_k w[t, k] * expert_{e[t, k]}(x[t]), the same as the EP1 chain on all experts, and so does
its All2All (prefill) sequence with its list-form all-to-all carried by all_to_all_single; what a rank receives
is every token copy routed to its experts, grouped by local expert then source rank, in the kernel's fixed-size
buffer; the same under ``torch.compile(fullgraph=True)``. At the tiny model's shape (8 experts, top 2, hidden 64,
fp32 and bf16) and at DeepSeek-V3's routing shape (256 experts, top 8). Then vllm-ascend's own
`fused_experts_with_mc2` (EP 2) and `fused_experts` (EP 1) on these ops."""

from __future__ import annotations

import pytest

from verl_patches.multirank import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

CONFIGS = (
    {"experts": 8, "k": 2, "tokens": (3, 5), "hidden": 64, "inter": 32, "dtype": "float32"},
    {"experts": 8, "k": 2, "tokens": (4, 1), "hidden": 64, "inter": 32, "dtype": "bfloat16"},
    {"experts": 256, "k": 8, "tokens": (2, 4), "hidden": 16, "inter": 4, "dtype": "float32"},
)


def _expected_received(x_all, ids_all, owners, rank, local):
    """What this rank must hold: for each of its experts, every source rank's token copies routed to it, in order."""
    import torch

    rows = []
    for le in range(local):
        expert = rank * local + le
        for src_tokens in owners:
            rows += [x_all[t] for t in src_tokens if expert in ids_all[t].tolist()]
    return torch.stack(rows) if rows else x_all.new_zeros(0, x_all.shape[1])


def _ep2_round_trip(rank: int, world: int) -> list[dict]:
    import torch
    import torch.distributed as dist

    from tests.npu_emulation.moe_reference import (
        ep_batch,
        fused_experts_all2all,
        fused_experts_ep1,
        fused_experts_mc2,
        moe_reference,
    )
    from verl_patches.npu_emulation import hccl_names
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    name = hccl_names.name_for_group(dist.group.WORLD)
    results = []
    for i, cfg in enumerate(CONFIGS):
        dtype = getattr(torch, cfg["dtype"])
        experts, k, hidden, inter = cfg["experts"], cfg["k"], cfg["hidden"], cfg["inter"]
        # every rank builds the same global data and keeps its own tokens and its own experts
        batch = ep_batch(cfg["tokens"], experts, k, hidden, inter, seed=100 + i, stride=100, dtype=dtype)
        x_all, ids_all, w13, w2 = batch.x, batch.ids, batch.w13, batch.w2
        owners = [range(batch.rows(r).start, batch.rows(r).stop) for r in range(world)]
        mine, experts_here = batch.rows(rank), batch.experts_of(rank)
        x, ids, w = x_all[mine], ids_all[mine], batch.weights[mine]
        local = experts // world
        global_bs = max(cfg["tokens"]) * world
        args = (x, w13[experts_here], w2[experts_here], w, ids, name, world, rank, experts, global_bs)

        out, dispatched = fused_experts_mc2(*args)
        compiled = torch.compile(lambda *a: fused_experts_mc2(*a)[0], fullgraph=True, backend="eager")(*args)
        torch._dynamo.reset()
        ep1 = fused_experts_ep1(x, w13, w2, w, ids)
        all2all = fused_experts_all2all(x, w13[experts_here], w2[experts_here], w, ids, experts, dist.group.WORLD)
        ref = moe_reference(x.float(), w13.float(), w2.float(), w.float(), ids)

        expand_x, dynamic_scales, expand_idx, token_nums, recv_counts, tp_counts, expand_scales = dispatched
        expected = _expected_received(x_all, ids_all, owners, rank, local)
        received = int(token_nums.sum())
        results.append(
            {
                "out_dtype": str(out.dtype),
                "err_ref": float((out.double() - ref).abs().max() / ref.abs().max()),
                "err_ep1": float((out.double() - ep1.double()).abs().max()),
                "err_compiled": float((compiled.double() - out.double()).abs().max()),
                "err_all2all": float((all2all.double() - ep1.double()).abs().max()),
                "shapes": [list(t.shape) for t in dispatched],
                "dtypes": [str(t.dtype) for t in dispatched],
                "bound": global_bs * min(local, k),
                "received": received,
                "layout_ok": received == expected.shape[0] and torch.equal(expand_x[:received], expected),
                "tail_zero": bool((expand_x[received:] == 0).all()),
                "per_expert_ok": token_nums.tolist()
                == [sum(rank * local + le in row for row in ids_all.tolist()) for le in range(local)],
                "recv_counts_last": int(recv_counts[-1]),
                "expand_idx_len": expand_idx.numel(),
                "aux_zero": bool((dynamic_scales == 0).all() and (tp_counts == 0).all() and (expand_scales == 0).all()),
            }
        )
    return results


def test_ep2_dispatch_experts_combine_equals_ep1_and_the_reference():
    per_rank = run_ranks(_ep2_round_trip, 2, timeout_s=240)
    for rank, results in enumerate(per_rank):
        for cfg, res in zip(CONFIGS, results):
            where = f"rank {rank}, {cfg}"
            bf16 = cfg["dtype"] == "bfloat16"
            assert res["out_dtype"] == f"torch.{cfg['dtype']}", where
            # relative to the largest output; bf16 rounds every intermediate, and EP2 then equals EP1 bit for bit
            assert res["err_ref"] < (2e-2 if bf16 else 1e-5), (where, res)
            assert res["err_ep1"] < (1e-12 if bf16 else 1e-5), (where, res)
            assert res["err_all2all"] < (1e-12 if bf16 else 1e-5), (where, res)  # prefill's path, same ops
            assert res["err_compiled"] == 0.0, (where, res)
            assert res["layout_ok"] and res["tail_zero"] and res["per_expert_ok"], (where, res)
            assert res["recv_counts_last"] == res["received"] <= res["bound"], (where, res)
            local, k = cfg["experts"] // 2, cfg["k"]
            bound = res["bound"]
            assert res["shapes"] == [
                [bound, cfg["hidden"]],
                [bound],
                [cfg["tokens"][rank] * k],
                [local],
                [2 * local],
                [1],
                [0],  # expand_scales: none on A3, the wheel's Meta gives an empty tensor
            ], where
            assert res["dtypes"] == [
                f"torch.{cfg['dtype']}",
                "torch.float32",
                "torch.int32",
                "torch.int64",
                "torch.int32",
                "torch.int32",
                "torch.float32",
            ], where
            assert res["aux_zero"], where


def _wrong_group_size(rank: int, world: int) -> str:
    import torch
    import torch.distributed as dist

    from verl_patches.npu_emulation import hccl_names
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    name = hccl_names.name_for_group(dist.group.WORLD)
    x, ids = torch.randn(2, 4), torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    try:
        torch.ops.npu.npu_moe_distribute_dispatch(x, ids, name, 4, rank, 4)
    except ValueError as e:
        return str(e)
    return "no error"


def test_dispatch_names_a_group_that_does_not_match_ep_world_size():
    for msg in run_ranks(_wrong_group_size, 2, timeout_s=120):
        assert "has 2 ranks" in msg and "ep_world_size=4" in msg


def _vllm_ascend_functions(rank: int, world: int) -> dict:
    """vllm-ascend's own functions on CPU tensors: its parallel state built by vLLM over the gloo-carried `hccl`
    backend, its A3 SoC version, a forward context with max_tokens_across_dp (what set_ascend_forward_context
    sets), and the MC2 group's communicator name from our registry (vllm-ascend asks the backend for it, and gloo
    has none: the name it would find is None)."""
    import torch
    from vllm.config import VllmConfig
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.forward_context import get_forward_context, set_forward_context
    from vllm_ascend.distributed.parallel_state import get_mc2_group, init_ascend_model_parallel
    from vllm_ascend.ops import fused_moe
    from vllm_ascend.utils import init_ascend_soc_version

    from tests.npu_emulation.moe_reference import ep_batch, moe_reference
    from verl_patches.npu_emulation import hccl_names

    init_distributed_environment(world_size=world, rank=rank, local_rank=rank, backend="hccl")
    initialize_model_parallel(1, 1, backend="hccl")
    init_ascend_model_parallel(expert_parallel_size=world)
    init_ascend_soc_version()
    name = hccl_names.name_for_group(get_mc2_group().device_group)
    experts, k, hidden, inter, tokens = 8, 2, 64, 32, (3, 5)
    batch = ep_batch(tokens, experts, k, hidden, inter, seed=1)
    ids_all, w13, w2 = batch.ids, batch.w13, batch.w2
    mine, here = batch.rows(rank), batch.experts_of(rank)
    local = experts // world
    expert_map = torch.full((experts,), -1, dtype=torch.int32)
    expert_map[here] = torch.arange(local, dtype=torch.int32)
    x, w, ids = batch.x[mine], batch.weights[mine], ids_all[mine]
    with set_forward_context(None, VllmConfig()):
        get_forward_context().max_tokens_across_dp = max(tokens)
        mc2, token_nums, list_type = fused_moe.fused_experts_with_mc2(
            hidden_states=x, w1=w13[here], w2=w2[here], topk_weights=w, topk_ids=ids, top_k=k,
            expert_map=expert_map, moe_all_to_all_group_name=name, is_torchair=True,
        )  # fmt: skip
    ep1, _, _ = fused_moe.fused_experts(x, w13, w2, w, ids, k)
    ref = moe_reference(x, w13, w2, w, ids)
    return {
        "err_mc2": float((mc2.double() - ref).abs().max()),
        "err_ep1": float((ep1.double() - ref).abs().max()),
        "token_nums": token_nums.tolist(),
        "list_type": list_type,
        "expected_nums": [sum(rank * local + le in row for row in ids_all.tolist()) for le in range(local)],
    }


@pytest.mark.slow
def test_vllm_ascend_fused_experts_with_mc2_and_fused_experts_run_on_these_ops():
    for res in run_ranks(_vllm_ascend_functions, 2, timeout_s=280, preload=("verl_patches.prelude_patch",)):
        assert res["err_mc2"] < 1e-5 and res["err_ep1"] < 1e-5, res
        assert res["token_nums"] == res["expected_nums"] and res["list_type"] == 1, res
