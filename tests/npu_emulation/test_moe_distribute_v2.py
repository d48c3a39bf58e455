"""MC2 v2 (`npu_moe_distribute_dispatch_v2` / `_combine_v2`, the pair vllm-ascend calls on A3) against a plain
reference, on 2 and 4 CPU ranks over gloo: what each rank receives (rows grouped by local expert then source
rank, zeros after), the counts, assist_info_for_combine's (source rank, token, slot) triples, and the combined
output with an expert that scales each row by its expert's number, for masked tokens (x_active_mask, 1-D and
2-D), uneven expert loads, a rank that receives nothing, a rank that sends nothing, and ranks with different
batch sizes. v1 and v2 give bit-identical outputs on the same unmasked inputs (and on the active tokens of a
masked batch); the v2 op chain with the experts' grouped matmuls equals v1 and the float64 reference, also compiled
with ``torch.compile(fullgraph=True)``. Then the errors: every rank stops when one rank's values are wrong."""

from __future__ import annotations

import pytest

from verl_patches.multirank import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

EXPERTS, K, HIDDEN = 8, 2, 16

# name -> per-rank batch sizes, per-rank active tokens (None: no mask; "2d": a (BS, K) mask), experts allowed
CASES = {
    "unmasked": {"tokens": (4, 4, 4, 4), "active": None, "experts": None},
    "masked_tail": {"tokens": (5, 5, 5, 5), "active": (3, 5, 0, 1), "experts": None},  # rank 2 sends nothing
    "mask_2d": {"tokens": (4, 4, 4, 4), "active": "2d", "experts": None},
    "uneven_last_rank_idle": {"tokens": (6, 6, 6, 6), "active": None, "experts": "not_last_rank"},
    "different_batches": {"tokens": (1, 6, 3, 2), "active": None, "experts": None},
}


def _case_inputs(name: str, world: int, seed: int):
    """The whole group's data, built identically on every rank."""
    import torch

    from tests.npu_emulation.moe_reference import gen

    case = CASES[name]
    tokens = case["tokens"][:world]
    g = gen(seed)
    local = EXPERTS // world
    allowed = EXPERTS - local if case["experts"] == "not_last_rank" else EXPERTS
    xs, ids, weights, masks = [], [], [], []
    for r, n in enumerate(tokens):
        xs.append(torch.randn(n, HIDDEN, generator=g))
        ids.append(torch.stack([torch.randperm(allowed, generator=g)[:K] for _ in range(n)]).to(torch.int32))
        weights.append(torch.rand(n, K, generator=g))
        if case["active"] is None:
            masks.append(None)
        elif case["active"] == "2d":
            m = torch.rand(n, K, generator=g) < 0.6
            m[0] = False  # a token with no active slot
            masks.append(m)
        else:
            m = torch.zeros(n, dtype=torch.bool)
            m[: case["active"][r]] = True
            masks.append(m)
    return tokens, xs, ids, weights, masks


def _slot_mask(mask, n: int):
    import torch

    if mask is None:
        return torch.ones(n, K, dtype=torch.bool)
    return mask if mask.dim() == 2 else mask.unsqueeze(1).expand(n, K)


def _reference(rank: int, world: int, xs, ids, masks):
    """What rank `rank` must receive: (rows, triples, rows per local expert, cumulative (expert, source) counts)."""
    import torch

    local = EXPERTS // world
    rows, triples, per_expert, blocks = [], [], [], []
    for le in range(local):
        expert = rank * local + le
        n_expert = 0
        for src in range(world):
            slots = _slot_mask(masks[src], xs[src].shape[0])
            n_block = 0
            for t in range(xs[src].shape[0]):
                for k in range(K):
                    if slots[t, k] and int(ids[src][t, k]) == expert:
                        rows.append(xs[src][t])
                        triples.append([src, t, k])
                        n_block += 1
            blocks.append(n_block)
            n_expert += n_block
        per_expert.append(n_expert)
    rows = torch.stack(rows) if rows else torch.zeros(0, HIDDEN)
    return rows, triples, per_expert, torch.tensor(blocks).cumsum(0).tolist()


def _scale_by_expert(expand_x, expert_token_nums, rank: int, local: int):
    """A stand-in expert computation: the rows of global expert e times (e + 1)."""
    import torch

    factors = torch.repeat_interleave(
        torch.arange(rank * local, (rank + 1) * local, dtype=expand_x.dtype) + 1, expert_token_nums
    )
    out = expand_x.clone()
    out[: factors.numel()] *= factors.unsqueeze(1)
    return out


def _round_trips(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from verl_patches.npu_emulation import hccl_names
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    npu = torch.ops.npu
    name = hccl_names.name_for_group(dist.group.WORLD)
    local = EXPERTS // world
    results = {}
    for i, case in enumerate(CASES):
        tokens, xs, ids, weights, masks = _case_inputs(case, world, seed=10 + i)
        x, expert_ids, w, mask = xs[rank], ids[rank], weights[rank], masks[rank]
        global_bs = max(tokens) * world
        common = dict(group_ep=name, ep_world_size=world, ep_rank_id=rank, moe_expert_num=EXPERTS,
                      global_bs=global_bs, group_tp=name, tp_world_size=1, tp_rank_id=0)  # fmt: skip
        out2 = npu.npu_moe_distribute_dispatch_v2(x=x, expert_ids=expert_ids, x_active_mask=mask, **common)
        expand_x, dyn, assist, token_nums, recv_counts, tp_counts, expand_scales = out2
        combined = npu.npu_moe_distribute_combine_v2(
            expand_x=_scale_by_expert(expand_x, token_nums, rank, local), expert_ids=expert_ids,
            assist_info_for_combine=assist, ep_send_counts=recv_counts, expert_scales=w, tp_send_counts=tp_counts,
            x_active_mask=mask, **common,
        )  # fmt: skip
        rows, triples, per_expert, blocks = _reference(rank, world, xs, ids, masks)
        received = rows.shape[0]
        slots = _slot_mask(mask, x.shape[0])
        factor = (expert_ids.double() + 1) * w.double() * slots.double()
        want = (factor.sum(dim=1, keepdim=True) * x.double()).float()
        res = {
            "bound": global_bs * min(local, K),
            "shapes": [list(t.shape) for t in out2],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in out2],
            "received": received,
            "rows_ok": torch.equal(expand_x[:received], rows) and bool((expand_x[received:] == 0).all()),
            "triples_ok": assist[: 3 * received].view(-1, 3).tolist() == triples
            and bool((assist[3 * received :] == 0).all()),
            "token_nums": token_nums.tolist(),
            "want_token_nums": per_expert,
            "recv_counts": recv_counts.tolist(),
            "want_recv_counts": blocks,
            "aux_zero": bool((dyn == 0).all() and (tp_counts == 0).all()),
            "err_combined": float((combined - want).abs().max()) if x.shape[0] else 0.0,
            "inactive_zero": bool((combined[~slots.any(dim=1)] == 0).all()),
        }
        if mask is None or mask.dim() == 1:  # the same tokens through v1 (which takes no mask)
            out1 = npu.npu_moe_distribute_dispatch(x=x, expert_ids=expert_ids, **common)
            combined1 = npu.npu_moe_distribute_combine(
                expand_x=_scale_by_expert(out1[0], out1[3], rank, local), expert_ids=expert_ids, expand_idx=out1[2],
                ep_send_counts=out1[4], expert_scales=w, tp_send_counts=out1[5], **common,
            )  # fmt: skip
            active = slots.any(dim=1)
            res["v1_equals_v2"] = torch.equal(combined1[active], combined[active])
            res["v1_same_rows"] = mask is not None or torch.equal(out1[0], expand_x)
        results[case] = res
    return results


def _check_round_trips(per_rank: list[dict], world: int) -> None:
    local = EXPERTS // world
    for rank, results in enumerate(per_rank):
        for case, res in results.items():
            where = f"EP{world} rank {rank}, case {case}"
            bound = res["bound"]
            tokens = CASES[case]["tokens"][rank]
            assert res["shapes"] == [
                [bound, HIDDEN],
                [bound],
                [max(tokens * K, bound * 128)],  # the wheel's Meta: max(BS*K, A*128)
                [local],
                [world * local],
                [1],
                [0],
            ], where
            assert res["dtypes"] == ["float32", "float32", "int32", "int64", "int32", "int32", "float32"], where
            assert res["received"] <= bound, (where, res)
            assert res["rows_ok"] and res["triples_ok"] and res["aux_zero"], (where, res)
            assert res["token_nums"] == res["want_token_nums"], (where, res)
            assert res["recv_counts"] == res["want_recv_counts"], (where, res)
            assert res["err_combined"] < 1e-5 and res["inactive_zero"], (where, res)
            if "v1_equals_v2" in res:
                assert res["v1_equals_v2"] and res["v1_same_rows"], (where, res)


@pytest.mark.parametrize("world", [2, 4])
def test_v2_dispatch_and_combine_match_the_reference(world: int):
    per_rank = run_ranks(_round_trips, world, timeout_s=240)
    _check_round_trips(per_rank, world)
    if world == 4:  # the cases do what their names say
        assert per_rank[3]["uneven_last_rank_idle"]["received"] == 0
        assert per_rank[2]["masked_tail"]["received"] > 0  # it receives, though it sends nothing


def _mlp_chain(rank: int, world: int) -> dict:
    """vllm-ascend's MC2 op sequence with real experts (grouped matmuls), v2 with a mask vs v1 vs float64."""
    import torch
    import torch.distributed as dist

    from tests.npu_emulation.moe_reference import ep_batch, fused_experts_mc2, moe_reference
    from verl_patches.npu_emulation import hccl_names
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    name = hccl_names.name_for_group(dist.group.WORLD)
    experts, k, hidden, inter, tokens = 8, 2, 64, 32, 6
    batch = ep_batch((tokens,) * world, experts, k, hidden, inter, seed=1)
    mine, here, w13, w2 = batch.rows(rank), batch.experts_of(rank), batch.w13, batch.w2
    x, ids, w = batch.x[mine], batch.ids[mine], batch.weights[mine]
    mask = torch.arange(tokens) < tokens - 1 - rank  # each rank pads a different number of rows
    args = (x, w13[here], w2[here], w, ids, name, world, rank, experts, tokens * world)
    v2, _ = fused_experts_mc2(*args, x_active_mask=mask, v2=True)
    compiled = torch.compile(lambda *a: fused_experts_mc2(*a, x_active_mask=mask, v2=True)[0], fullgraph=True,
                             backend="eager")(*args)  # fmt: skip
    torch._dynamo.reset()
    v1, _ = fused_experts_mc2(*args)
    unmasked, _ = fused_experts_mc2(*args, v2=True)
    ref = moe_reference(x, w13, w2, w, ids)
    return {
        "err_ref": float((v2[mask].double() - ref[mask]).abs().max()),
        "v1_equals_v2": torch.equal(v1, unmasked),
        # the padded rows change the experts' matmul sizes, and with them the last bits of the other rows
        "err_v1_masked": float((v1[mask] - v2[mask]).abs().max() / v1[mask].abs().max()),
        "padded_zero": bool((v2[~mask] == 0).all()),
        "err_compiled": float((compiled - v2).abs().max()),
    }


def test_v2_op_chain_with_experts_equals_v1_and_the_reference():
    for res in run_ranks(_mlp_chain, 2, timeout_s=240):
        assert res["err_ref"] < 1e-5 and res["v1_equals_v2"] and res["padded_zero"], res
        assert res["err_v1_masked"] < 1e-6, res  # relative to the largest output: fp32 rounding
        assert res["err_compiled"] == 0.0, res


def _errors(rank: int, world: int) -> dict:
    import torch
    import torch.distributed as dist

    from verl_patches.npu_emulation import hccl_names
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    npu = torch.ops.npu
    name = hccl_names.name_for_group(dist.group.WORLD)
    common = dict(group_ep=name, ep_world_size=world, ep_rank_id=rank, moe_expert_num=4)
    x = torch.randn(3, 8)
    ids = torch.tensor([[0, 2], [1, 3], [2, 0]], dtype=torch.int32)
    out = {}

    def attempt(key, fn):
        try:
            fn()
            out[key] = "no error"
        except (ValueError, RuntimeError) as e:
            out[key] = str(e)

    holes = torch.tensor([True, False, True]) if rank == 0 else torch.ones(3, dtype=torch.bool)
    attempt("mask_with_a_hole", lambda: npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=holes, **common))
    short = x[: 1 + rank]
    attempt(
        "mask_while_batches_differ",
        lambda: npu.npu_moe_distribute_dispatch_v2(
            short, ids[: 1 + rank], x_active_mask=torch.arange(1 + rank) < 1, global_bs=2 * world,
            **common,
        ),
    )  # fmt: skip
    mask = torch.tensor([True, True, False])
    d = npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=mask, **common)
    other = torch.ones(3, dtype=torch.bool) if rank == 1 else mask
    attempt(
        "combine_with_another_mask",
        lambda: npu.npu_moe_distribute_combine_v2(d[0], ids, d[2], d[4], torch.ones(3, 2), x_active_mask=other,
                                                  **common),
    )  # fmt: skip
    forged = d[2].clone()
    if rank == 0:
        forged[0] = 7  # a source rank that does not exist
    attempt(
        "forged_assist_info",
        lambda: npu.npu_moe_distribute_combine_v2(d[0], ids, forged, d[4], torch.ones(3, 2), x_active_mask=mask,
                                                  **common),
    )  # fmt: skip
    # the pair still works after the refusals (no rank was left inside an exchange)
    d = npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=mask, **common)
    y = npu.npu_moe_distribute_combine_v2(d[0], ids, d[2], d[4], torch.ones(3, 2), x_active_mask=mask, **common)
    out["after"] = float((y[:2] - 2 * x[:2]).abs().max())
    return out


def test_every_rank_stops_when_one_ranks_values_are_wrong():
    ranks = run_ranks(_errors, 2, timeout_s=120)
    assert "True entries before its False ones" in ranks[0]["mask_with_a_hole"], ranks[0]
    assert "EP rank(s) [0] refused their inputs" in ranks[1]["mask_with_a_hole"], ranks[1]
    for out in ranks:
        assert (
            "EP rank(s) [1] mask tokens (x_active_mask) while the ranks' BS differ ([1, 2])"
            in out["mask_while_batches_differ"]
        ), out
        assert "rank pairs" in out["combine_with_another_mask"] and "disagree" in out["combine_with_another_mask"]
        assert out["after"] < 1e-6, out
    assert "names a rank or slot that does not exist" in ranks[0]["forged_assist_info"], ranks[0]
    assert "EP rank(s) [0] refused their inputs" in ranks[1]["forged_assist_info"], ranks[1]


@pytest.fixture
def registered_name():
    """A communicator name for the fake implementations (which only look the name up)."""
    from verl_patches.npu_emulation import hccl_names

    name = hccl_names.register_group("fake_shapes_test", object())
    yield name
    hccl_names.forget(name)


@pytest.mark.parametrize(("tokens", "experts", "world", "top_k", "global_bs"), [(8, 8, 2, 2, 0), (3, 256, 4, 8, 32)])
def test_fake_shapes_are_the_wheels_meta_shapes(registered_name, tokens, experts, world, top_k, global_bs):
    """Sized without running: the shapes the wheel's Meta functions give (A = global_bs x min(L, K))."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    npu = torch.ops.npu
    local = experts // world
    a = (global_bs or tokens * world) * min(local, top_k)
    with FakeTensorMode():
        x = torch.empty(tokens, 16, dtype=torch.bfloat16)
        ids = torch.empty(tokens, top_k, dtype=torch.int32)
        args = dict(group_ep=registered_name, ep_world_size=world, ep_rank_id=1, moe_expert_num=experts,
                    global_bs=global_bs)  # fmt: skip
        mask = torch.empty(tokens, dtype=torch.bool)
        v2 = npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=mask, **args)
        v1 = npu.npu_moe_distribute_dispatch(x, ids, **args)
        y2 = npu.npu_moe_distribute_combine_v2(v2[0], ids, v2[2], v2[4], torch.empty(tokens, top_k), **args)
        y1 = npu.npu_moe_distribute_combine(v1[0], ids, v1[2], v1[4], torch.empty(tokens, top_k), **args)
    common = [[a], [local], [world * local], [0], [0]]
    assert [list(t.shape) for t in v2] == [[a, 16], *common[:1], [max(tokens * top_k, a * 128)], *common[1:]]
    assert [list(t.shape) for t in v1] == [[a, 16], *common[:1], [tokens * top_k], *common[1:]]
    assert v2[0].dtype == torch.bfloat16 and v2[2].dtype == torch.int32 and v2[6].dtype == torch.float32
    assert list(y2.shape) == list(y1.shape) == [tokens, 16] and y2.dtype == y1.dtype == torch.bfloat16


def test_the_kernels_bind_their_arguments_as_the_registered_schemas():
    """The kernels bind ``*args, **kwargs`` through DispatchArgs / CombineArgs / CombineV2Args: each takes the
    registered (the wheel's) schema's positional arguments in its order and its keyword-only ones with its
    defaults, so a direct call binds as the dispatcher's does."""
    import inspect

    import torch

    from verl_patches.npu_emulation.ops import moe_distribute
    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops
    from verl_patches.npu_emulation.wheel_contract.registration import signature

    register_moe_ops()
    keyword = inspect.Parameter.KEYWORD_ONLY

    def positional(params):
        return [(name, p.default) for name, p in params.items() if p.kind is not keyword]

    def keyword_only(params):
        return {name: p.default for name, p in params.items() if p.kind is keyword}

    for op, binder in [
        ("npu_moe_distribute_dispatch", moe_distribute.DispatchArgs),
        ("npu_moe_distribute_dispatch_v2", moe_distribute.DispatchArgs),
        ("npu_moe_distribute_combine", moe_distribute.CombineArgs),
        ("npu_moe_distribute_combine_v2", moe_distribute.CombineV2Args),
    ]:
        schema = signature(getattr(torch.ops.npu, op).default._schema).parameters
        ours = inspect.signature(binder).parameters
        assert positional(ours) == positional(schema), op
        assert keyword_only(ours) == keyword_only(schema), op
    with pytest.raises(TypeError, match="activation_scale"):  # a v1-only input is no argument of v2
        moe_distribute.npu_moe_distribute_combine_v2(*[None] * 9, activation_scale=None)


def test_arguments_refused_before_any_exchange(registered_name):
    import torch

    from verl_patches.npu_emulation.ops.moe_registry import register_moe_ops

    register_moe_ops()
    npu = torch.ops.npu
    x, ids = torch.randn(2, 4), torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    args = dict(group_ep=registered_name, ep_world_size=2, ep_rank_id=0, moe_expert_num=2)
    mask = torch.ones(2, dtype=torch.bool)
    with pytest.raises(ValueError, match="x_active_mask is a reserved parameter of the v1 pair"):
        npu.npu_moe_distribute_dispatch(x, ids, x_active_mask=mask, **args)
    with pytest.raises(TypeError, match="x_active_mask must be bool"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=mask.int(), **args)
    with pytest.raises(ValueError, match=r"shape \(BS,\) = \(2,\) or \(BS, K\) = \(2, 2\)"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, x_active_mask=torch.ones(3, dtype=torch.bool), **args)
    with pytest.raises(NotImplementedError, match="a TP domain is not emulated"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, tp_world_size=2, **args)
    with pytest.raises(NotImplementedError, match="shared-expert ranks"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, shared_expert_rank_num=1, **args)
    with pytest.raises(ValueError, match="shared_expert_num=2 with shared_expert_rank_num=0"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, shared_expert_num=2, **args)
    with pytest.raises(ValueError, match=r"shared_expert_rank_num=2 must be in \[0, ep_world_size=2\)"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, shared_expert_rank_num=2, **args)
    with pytest.raises(NotImplementedError, match="expert_scales"):
        npu.npu_moe_distribute_dispatch_v2(x, ids, expert_scales=torch.ones(2, 2), **args)
    a, words = 2 * 2 * 1, 2 * 2 * 1 * 128  # A = BS x ep_world_size x min(L, K); A * 128 words
    expand_x, assist = torch.zeros(a, 4), torch.zeros(words, dtype=torch.int32)
    counts = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="shared_expert_x is not emulated"):
        npu.npu_moe_distribute_combine_v2(expand_x, ids, assist, counts, torch.ones(2, 2), shared_expert_x=x, **args)
    with pytest.raises(ValueError, match=f"assist_info_for_combine must be dispatch's, int32 \\({words},\\)"):
        npu.npu_moe_distribute_combine_v2(expand_x, ids, assist[:-1], counts, torch.ones(2, 2), **args)
    with pytest.raises(ValueError, match="expand_x must have dispatch's A = 4 rows"):
        npu.npu_moe_distribute_combine_v2(expand_x[:3], ids, assist, counts, torch.ones(2, 2), **args)
    with pytest.raises(TypeError, match="expert_scales must be float32"):
        npu.npu_moe_distribute_combine_v2(expand_x, ids, assist, counts, torch.ones(2, 2).double(), **args)
