"""vllm-ascend's MC2 path (`vllm_ascend.ops.fused_moe.fused_experts_with_mc2`) through both of its branches on
the emulation, at EP 2: with the v2 ops visible on torch_npu (``hasattr(torch_npu,
"npu_moe_distribute_dispatch_v2")``, as on the real torch_npu 2.5.1.post1 wheel) it takes A3's branch, the v2
pair with vllm-ascend's own ``mc2_mask`` as ``x_active_mask``; with them hidden, the v1 pair. Same inputs, same
outputs on the real tokens (the padded rows, masked off in v2, combine to zeros), equal to the float64
reference; and the calls counted say which ops ran.

The forward context is vllm-ascend's own (`set_ascend_forward_context` over vLLM's DP 2 groups, decode, ranks
with different step sizes and a graph batch's padding: it pads every rank to the group's largest step, builds
the mask and picks MC2 at EP 2 through the CPU host's declared MC2 patch)."""

from __future__ import annotations

import pytest

from verl_patches.multirank import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(400)]

V1 = ("npu_moe_distribute_dispatch", "npu_moe_distribute_combine")
V2 = ("npu_moe_distribute_dispatch_v2", "npu_moe_distribute_combine_v2")


def _both_branches(rank: int, world: int) -> dict:
    import torch
    import torch_npu
    from vllm.config import ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.forward_context import get_forward_context
    from vllm_ascend.ascend_forward_context import FusedMoEState, set_ascend_forward_context
    from vllm_ascend.distributed.parallel_state import get_mc2_group, init_ascend_model_parallel
    from vllm_ascend.ops import fused_moe
    from vllm_ascend.utils import init_ascend_soc_version

    from tests.npu_emulation.moe_reference import ep_batch, moe_reference
    from verl_patches.npu_emulation import hccl_names

    # the rollout's layout: vLLM DP 2 x TP 1, experts over DP x TP (EP 2), as the engine builds it
    config = VllmConfig(
        parallel_config=ParallelConfig(data_parallel_size=world, data_parallel_rank=rank, enable_expert_parallel=True)
    )
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=rank, backend="hccl")
        initialize_model_parallel(1, 1, backend="hccl")
        init_ascend_model_parallel(expert_parallel_size=world)
    init_ascend_soc_version()
    name = hccl_names.name_for_group(get_mc2_group().device_group)
    experts, k, hidden, inter, padded = 8, 2, 64, 32, 6
    # rank 0: 4 tokens in the step, 3 of them real (a graph batch's padding); rank 1: 6 real. vllm-ascend pads
    # both to the largest step of the DP group (6) and masks what is not real
    num_tokens, real = (4, 6)[rank], (3, 6)[rank]
    batch = ep_batch((padded,) * world, experts, k, hidden, inter, seed=11)
    mine, here, w13, w2 = batch.rows(rank), batch.experts_of(rank), batch.w13, batch.w2
    x, ids, w = batch.x[mine], batch.ids[mine], batch.weights[mine]
    x[real:] = 0  # the padding vllm-ascend adds (nn.functional.pad)
    local = experts // world
    expert_map = torch.full((experts,), -1, dtype=torch.int32)
    expert_map[here] = torch.arange(local, dtype=torch.int32)

    calls: dict[str, list[dict]] = {op: [] for op in V1 + V2}
    originals = {op: getattr(torch_npu, op) for op in V1 + V2}

    def counted(op):
        def call(*args, **kwargs):
            calls[op].append({key: kwargs.get(key) for key in ("x_active_mask",)})
            return originals[op](*args, **kwargs)

        return call

    outputs, states, masks = {}, {}, {}
    try:
        for branch in ("v2", "v1"):
            for op in V1 + V2:
                if branch == "v1" and op in V2:
                    delattr(torch_npu, op)  # what a torch_npu without the v2 pair looks like
                else:
                    setattr(torch_npu, op, counted(op))
            with set_ascend_forward_context(None, config, num_tokens=num_tokens, num_actual_tokens=real,
                                            with_prefill=False):  # fmt: skip
                assert get_forward_context().padded_num_tokens == padded
                ctx = get_forward_context()
                states[branch], masks[branch] = ctx.fused_moe_state == FusedMoEState.MC2, ctx.mc2_mask.clone()
                outputs[branch], token_nums, _ = fused_moe.fused_experts_with_mc2(
                    hidden_states=x, w1=w13[here], w2=w2[here], topk_weights=w, topk_ids=ids, top_k=k,
                    expert_map=expert_map, moe_all_to_all_group_name=name, is_torchair=True,
                    mc2_mask=ctx.mc2_mask,
                )  # fmt: skip
            outputs[branch + "_token_nums"] = token_nums.tolist()
            for op in V1 + V2:
                setattr(torch_npu, op, originals[op])
    finally:
        for op in V1 + V2:
            setattr(torch_npu, op, originals[op])
    ref = moe_reference(x, w13, w2, w, ids)
    v1, v2 = outputs["v1"], outputs["v2"]
    counts = {op: len(c) for op, c in calls.items()}
    v2_mask = calls[V2[0]][0]["x_active_mask"] if calls[V2[0]] else None
    return {
        "mc2_state": states,
        "mask": masks["v2"].tolist(),
        "masks_equal": torch.equal(masks["v1"], masks["v2"]),
        "counts": counts,
        "v2_got_the_mask": v2_mask is not None and torch.equal(v2_mask.cpu(), masks["v2"].cpu()),
        "v1_got_no_mask": all(c["x_active_mask"] is None for op in V1 for c in calls[op]),
        "err_v1_v2": float((v1[:real] - v2[:real]).abs().max() / v1[:real].abs().max()),
        "err_ref": float((v2[:real].double() - ref[:real]).abs().max()),
        "padded_zero": bool((v2[real:] == 0).all()),
        "token_nums": (outputs["v1_token_nums"], outputs["v2_token_nums"]),
        "restored": all(getattr(torch_npu, op) is originals[op] for op in V1 + V2),
    }


@pytest.mark.slow
def test_fused_experts_with_mc2_takes_v2_when_torch_npu_has_it_and_v1_when_not():
    ranks = run_ranks(_both_branches, 2, timeout_s=360, preload=("verl_patches.prelude_patch",))
    # the 3 masked rows of rank 0 (K = 2 slots each) were received nowhere in v2, and by their experts in v1
    assert sum(sum(v1) - sum(v2) for v1, v2 in (res["token_nums"] for res in ranks)) == 3 * 2, ranks
    for rank, res in enumerate(ranks):
        where = f"rank {rank}"
        assert res["mc2_state"] == {"v2": True, "v1": True}, (where, res)  # decode at EP 2: MC2
        assert res["mask"] == [True] * (3, 6)[rank] + [False] * (3, 0)[rank] and res["masks_equal"], (where, res)
        # which ops ran, counted on torch_npu: one dispatch and one combine per branch, each of its own pair
        assert res["counts"] == {V2[0]: 1, V2[1]: 1, V1[0]: 1, V1[1]: 1}, (where, res)
        assert res["v2_got_the_mask"] and res["v1_got_no_mask"], (where, res)
        assert res["err_v1_v2"] < 1e-6, (where, res)  # fp32 rounding of the experts' matmuls over other row sets
        assert res["err_ref"] < 1e-5 and res["padded_zero"], (where, res)
        assert res["restored"], where
